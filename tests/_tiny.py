"""The tiny workload every end-to-end test runs (8x8 images, batch 4): seconds, not minutes."""
TINY = dict(batch_size=4, image_size=8, steps=5, warmup=1, threads=1)
