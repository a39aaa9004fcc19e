"""What a refused command line prints: argparse's conventional form."""


def usage_error(err: str, prog: str = "cnncompare") -> str:
    """Assert ``err`` is the command's usage line(s), then exactly one ``PROG: error: MESSAGE``
    line naming the problem, and no traceback; return that line."""
    lines = err.rstrip("\n").splitlines()
    assert lines and lines[0].startswith("usage: "), err
    assert lines[-1].startswith(f"{prog}: error: "), err
    assert sum(line.startswith(f"{prog}: error") for line in lines) == 1 and "Traceback" not in err, err
    return lines[-1]
