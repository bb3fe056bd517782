import sys

from snakemake_executor_multinode.cli.main import main

sys.exit(main())
