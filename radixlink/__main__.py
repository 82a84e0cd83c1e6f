from radixlink.cli import main

raise SystemExit(main())
