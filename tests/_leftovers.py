"""Finding cell processes a test session left behind."""
import os


def leftover_cell_processes() -> list[str]:
    """Cell processes of this test session still alive: a forked cell (same command line as
    its fork server, but not our own child), a measuring child or a torchrun job, carrying
    this session's marker in its environment."""
    import psutil

    ours, me = os.environ["CNNCOMPARE_TEST_RUN"], os.getpid()
    left = []
    for p in psutil.process_iter(["cmdline", "ppid"]):
        try:
            cmd = " ".join(p.info["cmdline"] or [])
            server_or_cell = "cnncompare.core.run.forkserver" in cmd and p.info["ppid"] != me
            if (server_or_cell or "cnncompare.core.cell.main" in cmd or "torch.distributed.run" in cmd) \
                    and p.environ().get("CNNCOMPARE_TEST_RUN") == ours:
                left.append(f"{p.pid}: {cmd}")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return left
