"""The tiny workload every end-to-end test runs (8x8 images, batch 4): seconds, not minutes."""
from cnncompare.core.config import WorkloadSpec

TINY_WORKLOAD = WorkloadSpec("seed-cnn", {"image_size": 8}, "image")
#: One compile worker (in-process): a worker pool per compiling cell costs seconds the suite
#: doesn't need; test_e2e's fixture runs torch's default.
TINY = dict(batch_size=4, workload=TINY_WORKLOAD, steps=5, warmup=1, threads=1, rounds=1, compile_threads=1,
            round_s=0.0)
