"""`bench vllm`'s load section: a load's rate from the worker's batch line, and the warm load
it reports out of several."""

from radixlink.bench.vllm_load import batches, load_row, median_load


def _line(read_s: float) -> str:
    return (f"radixlink load batch: 32 pages, 100000000 bytes; read and verified in {read_s} s "
            "(0.002 s of copies into the blocks during it), waited 0.001 s for the model "
            "runner, scattered in 0.004 s")


def test_a_load_s_rate_counts_its_read_wait_and_scatter():
    (line,) = batches("noise\n" + _line(0.045) + "\nmore noise")
    row = load_row(line, ttft=0.5, device_ttft=0.2)
    assert row["GBps"] == 2.0  # 100 MB over 0.045 + 0.001 + 0.004 s
    assert row["ttft_over_device_hit_s"] == 0.3
    assert (row["read_verify_s"], row["landed_during_s"]) == (0.045, 0.002)


def test_the_warm_load_reported_is_the_one_of_median_rate():
    lines = batches("\n".join(_line(s) for s in (0.015, 0.095, 0.045)))
    loads = [load_row(line, 0.5, 0.2) for line in lines]
    assert [load["GBps"] for load in loads] == [5.0, 1.0, 2.0]
    assert median_load(loads)["GBps"] == 2.0
    assert median_load(loads[:2])["GBps"] == 1.0  # an even count: the slower middle one
    assert median_load(loads[2:]) is loads[2]
