/* The directory store's page reads with the GIL let go for the whole batch (optional; pure
   Python is the fallback, stores/pagefiles.py).

   Each page file is opened as untrusted input (no symlink followed, regular files only, a size
   limit, no blocking open), read into its pieces in runs of about `run_bytes`, and the xxh3 of
   the pieces between its first `skip_head` and last `skip_tail` is fed run by run while each run
   is in cache. Python only takes the buffers before and gives them back after.

   NOTE: why C. A load thread in Python takes the GIL back after every syscall and every xxh3
   update (about 67 a SGLang page); beside a scheduler running Python in the same process each
   of those waits on it. Measured in a plain process (64 pages of 60 x 12 KiB, one thread):
   alone 9.8 ms in Python, 8.65 here; beside a Python thread of the same process that lets
   the GIL go every ~8 us, 47.9 ms in Python and 10.6 here, where that thread also kept its
   speed (115k loops a second against 74k beside the Python loop).

   xxh3 comes from the xxhash package's own extension (its XXH3_* symbols, `bind`), so the
   digest is the one `xxhash.xxh3_64` gives. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#define MAX_IOV 1024

typedef void *(*create_fn)(void);
typedef int (*free_fn)(void *);
typedef int (*reset_fn)(void *);
typedef int (*update_fn)(void *, const void *, size_t);
typedef uint64_t (*digest_fn)(const void *);

static create_fn xxh_create;
static free_fn xxh_free;
static reset_fn xxh_reset;
static update_fn xxh_update;
static digest_fn xxh_digest;

typedef struct {
    char *path;      /* NULL: no page under this key */
    Py_ssize_t first; /* index of its first piece in the flat buffer list */
    Py_ssize_t count;
    long long size;  /* out: bytes stored, -1 none */
    int hashed;      /* out: digest holds the xxh3 of every hashed piece as read */
    uint64_t digest;
} Page;

static PyObject *bind(PyObject *self, PyObject *arg) {
    PyObject *bytes;
    if (!PyUnicode_FSConverter(arg, &bytes)) return NULL;
    void *lib = dlopen(PyBytes_AS_STRING(bytes), RTLD_NOW | RTLD_LOCAL);
    Py_DECREF(bytes);
    if (lib == NULL) Py_RETURN_FALSE;
    xxh_create = (create_fn)dlsym(lib, "XXH3_createState");
    xxh_free = (free_fn)dlsym(lib, "XXH3_freeState");
    xxh_reset = (reset_fn)dlsym(lib, "XXH3_64bits_reset");
    /* NOTE: the x86 dispatch build's update picks AVX2 at run time, as xxhash's own Python
       calls do: 45.9 GB/s against 24.6 for the portable one (a 512 KiB buffer, here) */
    xxh_update = (update_fn)dlsym(lib, "XXH3_64bits_update_dispatch");
    if (xxh_update == NULL) xxh_update = (update_fn)dlsym(lib, "XXH3_64bits_update");
    xxh_digest = (digest_fn)dlsym(lib, "XXH3_64bits_digest");
    if (!xxh_create || !xxh_free || !xxh_reset || !xxh_update || !xxh_digest) {
        xxh_create = NULL;
        Py_RETURN_FALSE;
    }
    Py_RETURN_TRUE;
}

/* Read the file open on fd into iov[0:n] from byte `done` on; the bytes read in all. */
static long long read_rest(int fd, struct iovec *iov, Py_ssize_t n, long long done,
                           long long want, struct iovec *scratch) {
    while (done < want) {
        long long skip = done;
        Py_ssize_t i = 0;
        while (i < n && skip >= (long long)iov[i].iov_len) skip -= iov[i++].iov_len;
        Py_ssize_t m = 0;
        for (; i < n && m < MAX_IOV; i++, m++) scratch[m] = iov[i];
        if (m == 0) break;
        scratch[0].iov_base = (char *)scratch[0].iov_base + skip;
        scratch[0].iov_len -= skip;
        ssize_t got = readv(fd, scratch, (int)m);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) return -2;
        if (got == 0) break;
        done += got;
    }
    return done;
}

/* One page: returns 0 read (or missing), 1 refused, 2 a read error. */
static int read_one(Page *p, struct iovec *iov, long long max_bytes, double touch_before,
                    size_t run_bytes, Py_ssize_t skip_head, Py_ssize_t skip_tail, void *state,
                    struct iovec *scratch) {
    p->size = -1;
    p->hashed = 0;
    if (p->path == NULL) return 0;
    int fd = open(p->path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return errno == ENOENT ? 0 : (errno == ELOOP ? 1 : 2);
    struct stat st;
    if (fstat(fd, &st) != 0) { close(fd); return 2; }
    if (!S_ISREG(st.st_mode) || st.st_size > max_bytes) { close(fd); return 1; }
    long long size = st.st_size, total = 0, done = 0;
    Py_ssize_t n = p->count, hash_end = n - skip_tail;
    for (Py_ssize_t i = 0; i < n; i++) total += iov[i].iov_len;
    long long want = size < total ? size : total;
    int whole = state != NULL && want == total && skip_head <= hash_end;
    if (whole) xxh_reset(state);
    /* runs of about run_bytes, each hashed while in cache; a short run ends the runs */
    Py_ssize_t start = 0;
    size_t run = 0;
    for (Py_ssize_t end = 1; whole && end <= n; end++) {
        run += iov[end - 1].iov_len;
        if (run < run_bytes && end < n && end - start < MAX_IOV) continue;
        ssize_t got;
        do got = readv(fd, iov + start, (int)(end - start)); while (got < 0 && errno == EINTR);
        if (got < 0) { close(fd); return 2; }
        done += got;
        if ((size_t)got < run) { whole = 0; break; }
        for (Py_ssize_t j = start; j < end; j++)
            if (j >= skip_head && j < hash_end) xxh_update(state, iov[j].iov_base, iov[j].iov_len);
        start = end;
        run = 0;
    }
    done = read_rest(fd, iov, n, done, want, scratch);
    if (done == -2) { close(fd); return 2; }
    if (done < want) size = done; /* the file shrank under the read */
    if (touch_before >= 0 && (double)st.st_mtime < touch_before) futimens(fd, NULL);
    close(fd);
    p->size = size;
    if (whole && done == total) {
        p->hashed = 1;
        p->digest = xxh_digest(state);
    }
    return 0;
}

/* read_pages(paths, targets, max_bytes, touch_before, run_bytes, skip_head, skip_tail)
   -> (sizes, refused, errors, digests): pagefiles.read_pages_xxh3's contract. */
static PyObject *read_pages(PyObject *self, PyObject *args) {
    PyObject *paths, *targets;
    long long max_bytes;
    double touch_before;
    Py_ssize_t run_bytes, skip_head, skip_tail;
    if (!PyArg_ParseTuple(args, "OOLdnnn", &paths, &targets, &max_bytes, &touch_before,
                          &run_bytes, &skip_head, &skip_tail))
        return NULL;
    PyObject *pseq = PySequence_Fast(paths, "paths must be a sequence");
    PyObject *tseq = pseq ? PySequence_Fast(targets, "targets must be a sequence") : NULL;
    PyObject *out = NULL;
    Py_ssize_t npages = 0, nbufs = 0, taken = 0;
    Page *pages = NULL;
    Py_buffer *bufs = NULL;
    struct iovec *iov = NULL, *scratch = NULL;
    PyObject **pathobjs = NULL;
    void *state = NULL;
    if (tseq == NULL) goto done;
    npages = PySequence_Fast_GET_SIZE(pseq);
    if (PySequence_Fast_GET_SIZE(tseq) != npages) {
        PyErr_SetString(PyExc_ValueError, "read_pages: one piece list per path");
        goto done;
    }
    for (Py_ssize_t i = 0; i < npages; i++) {
        PyObject *pieces = PySequence_Fast_GET_ITEM(tseq, i);
        Py_ssize_t k = PySequence_Size(pieces);
        if (k < 0) goto done;
        nbufs += k;
    }
    pages = PyMem_Calloc(npages ? npages : 1, sizeof(Page));
    pathobjs = PyMem_Calloc(npages ? npages : 1, sizeof(PyObject *));
    bufs = PyMem_Calloc(nbufs ? nbufs : 1, sizeof(Py_buffer));
    iov = PyMem_Calloc(nbufs ? nbufs : 1, sizeof(struct iovec));
    scratch = PyMem_Calloc(MAX_IOV, sizeof(struct iovec));
    if (!pages || !pathobjs || !bufs || !iov || !scratch) { PyErr_NoMemory(); goto done; }
    for (Py_ssize_t i = 0; i < npages; i++) {
        PyObject *path = PySequence_Fast_GET_ITEM(pseq, i);
        if (path != Py_None) {
            if (!PyUnicode_FSConverter(path, &pathobjs[i])) goto done;
            pages[i].path = PyBytes_AS_STRING(pathobjs[i]);
        }
        PyObject *pieces = PySequence_Fast(PySequence_Fast_GET_ITEM(tseq, i),
                                           "each target must be a sequence of buffers");
        if (pieces == NULL) goto done;
        pages[i].first = taken;
        pages[i].count = PySequence_Fast_GET_SIZE(pieces);
        for (Py_ssize_t j = 0; j < pages[i].count; j++, taken++) {
            if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(pieces, j), &bufs[taken],
                                   PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) != 0) {
                Py_DECREF(pieces);
                goto done;
            }
            iov[taken].iov_base = bufs[taken].buf;
            iov[taken].iov_len = (size_t)bufs[taken].len;
        }
        Py_DECREF(pieces);
    }
    if (xxh_create != NULL && (state = xxh_create()) == NULL) { PyErr_NoMemory(); goto done; }
    int refused = 0, errors = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < npages; i++) {
        int why = read_one(&pages[i], iov + pages[i].first, max_bytes, touch_before,
                           (size_t)run_bytes, skip_head, skip_tail, state, scratch);
        refused += why == 1;
        errors += why == 2;
    }
    Py_END_ALLOW_THREADS
    PyObject *sizes = PyList_New(npages), *digests = PyList_New(npages);
    if (sizes && digests) {
        for (Py_ssize_t i = 0; i < npages; i++) {
            PyObject *size = pages[i].size < 0 ? Py_NewRef(Py_None)
                                               : PyLong_FromLongLong(pages[i].size);
            PyObject *digest = pages[i].hashed ? PyLong_FromUnsignedLongLong(pages[i].digest)
                                               : Py_NewRef(Py_None);
            PyList_SET_ITEM(sizes, i, size);
            PyList_SET_ITEM(digests, i, digest);
            if (!size || !digest) break;
        }
        if (!PyErr_Occurred()) out = Py_BuildValue("(OiiO)", sizes, refused, errors, digests);
    }
    Py_XDECREF(sizes);
    Py_XDECREF(digests);
done:
    if (state != NULL) xxh_free(state);
    for (Py_ssize_t i = 0; i < taken; i++) PyBuffer_Release(&bufs[i]);
    for (Py_ssize_t i = 0; pathobjs && i < npages; i++) Py_XDECREF(pathobjs[i]);
    PyMem_Free(pages);
    PyMem_Free(pathobjs);
    PyMem_Free(bufs);
    PyMem_Free(iov);
    PyMem_Free(scratch);
    Py_XDECREF(pseq);
    Py_XDECREF(tseq);
    return out;
}

static PyMethodDef methods[] = {
    {"bind", bind, METH_O, "Take xxh3 from the shared library at this path; whether it has it."},
    {"read_pages", read_pages, METH_VARARGS, "See pagefiles.read_pages_xxh3."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_pagefiles", NULL, -1, methods};

PyMODINIT_FUNC PyInit__pagefiles(void) { return PyModule_Create(&module); }
