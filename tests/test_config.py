import pytest

from cnncompare.core.config import ConfigError, RunConfig, available_cores


@pytest.mark.parametrize(
    "field, value, option",
    [
        ("batch_size", 0, "--batch-size"),
        ("batch_size", -3, "--batch-size"),
        ("image_size", 0, "--image-size"),
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
    ],
)
def test_invalid_values_are_refused_naming_the_option(field, value, option):
    with pytest.raises(ConfigError) as info:
        RunConfig(**{field: value})
    assert info.value.option == option
    assert str(info.value).startswith(option)


def test_defaults_are_the_seed_study_and_threads_resolve_to_all_cores():
    c = RunConfig()
    assert (c.batch_size, c.image_size, c.steps, c.warmup) == (128, 28, 20, 3)
    assert c.resolved_threads == available_cores()
    assert c.to_dict()["threads"] == available_cores()


def test_round_trip_and_workload_key_ignores_selection():
    c = RunConfig(backends=("eager", "compile"), devices=("cpu",), steps=7)
    assert RunConfig.from_dict(c.to_dict()) == RunConfig(backends=("eager", "compile"), devices=("cpu",), steps=7, threads=c.resolved_threads)
    assert c.workload_key() == RunConfig(backends=("eager",), steps=7, timeout_s=5).workload_key()
    assert c.workload_key() != RunConfig(steps=8).workload_key()
