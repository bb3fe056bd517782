"""Snakemake's own executor test workflows, run through `--executor multinode` (invoked by
test_executor_cluster.py in a child pytest, against the local cluster SLURM_CONF points at)."""

from typing import Optional

import snakemake.common.tests
from snakemake_interface_executor_plugins.settings import ExecutorSettingsBase

from snakemake_executor_plugin_multinode import ExecutorSettings


class TestWorkflows(snakemake.common.tests.TestWorkflowsLocalStorageBase):
    __test__ = True

    def get_executor(self) -> str:
        return "multinode"

    def get_executor_settings(self) -> Optional[ExecutorSettingsBase]:
        return ExecutorSettings()
