from dataclasses import replace

import pytest

from cnncompare.core.config import ConfigError, RunConfig, WorkloadSpec, available_cores


@pytest.mark.parametrize(
    "field, value, option",
    [
        ("batch_size", 0, "--batch-size"),
        ("batch_size", -3, "--batch-size"),
        ("steps", 0, "--steps"),
        ("warmup", -1, "--warmup"),
        ("seed", -1, "--seed"),
        ("threads", 0, "--threads"),
        ("timeout_s", 0, "--timeout"),
        ("timeout_s", float("nan"), "--timeout"),
        ("max_memory_mb", 10, "--max-memory"),
        ("batch_size", 2.5, "--batch-size"),
        ("steps", True, "--steps"),
        ("malloc", "jemalloc", "--malloc"),
        ("round_s", -1, "--round-time"),
        ("round_s", float("inf"), "--round-time"),
    ],
)
def test_invalid_values_are_refused_naming_the_option(field, value, option):
    with pytest.raises(ConfigError) as info:
        RunConfig(**{field: value})
    assert info.value.option == option
    assert str(info.value).startswith(option)


def test_defaults_are_the_seed_study_and_threads_resolve_to_all_cores():
    c = RunConfig()
    assert (c.batch_size, c.steps, c.warmup, c.rounds, c.workload.name) == (128, 4, 3, 2, "seed-cnn")
    assert c.resolved_threads == available_cores()
    assert c.to_dict()["threads"] == available_cores()


def test_round_trip_and_comparability_ignores_selection():
    c = RunConfig(backends=("eager", "compile"), devices=("cpu",), steps=7, workload=WorkloadSpec("seed-cnn", {"image_size": 8}),
                  backend_options={"compile": {"x": True}})
    assert RunConfig.from_dict(c.to_dict()) == replace(c, threads=c.resolved_threads)
    assert c.comparable() != replace(c, backend_options={}).comparable()  # they change what a cell measures
    assert c.comparable() == replace(c, backends=("eager",), timeout_s=5, fork_server="per-run").comparable()
    assert c.comparable() != replace(c, steps=8).comparable()
    assert c.comparable() != replace(c, workload=WorkloadSpec("seed-cnn", {"image_size": 9})).comparable()


def test_a_report_from_before_workloads_reads_as_the_seed_cnn():
    old = {"backends": ["eager"], "devices": ["cpu"], "batch_size": 4, "image_size": 8, "in_channels": 3,
           "num_classes": 10, "lr": 0.001, "steps": 5, "warmup": 1, "seed": 0, "threads": 1, "timeout_s": 600.0,
           "max_memory_mb": None, "compile_cache": "cold", "compile_threads": 1}
    c = RunConfig.from_dict(old)
    assert c.workload == WorkloadSpec("seed-cnn", {"image_size": 8, "in_channels": 3, "num_classes": 10}, "image")
    assert c.rounds == 1  # measured before --rounds: one round
    assert c.fork_server == "per-run" and RunConfig().fork_server == "per-round"  # before --fork-server: one server
    with pytest.raises(ValueError, match="stepz"):
        RunConfig.from_dict({**c.to_dict(), "stepz": 3})  # a misspelled key is an error, not dropped
