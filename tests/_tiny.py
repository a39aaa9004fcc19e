"""The tiny workload every end-to-end test runs (8x8 images, batch 4): seconds, not minutes."""
from cnncompare.core.config import WorkloadSpec

TINY_WORKLOAD = WorkloadSpec("seed-cnn", {"image_size": 8}, "image")
TINY = dict(batch_size=4, workload=TINY_WORKLOAD, steps=5, warmup=1, threads=1, rounds=1)
