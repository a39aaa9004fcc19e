"""Running the command line in-process, and what a refused one prints: argparse's conventional form."""
from cnncompare.cli import main


def run_cli(capsys, *argv):
    """``cnncompare ARGV`` in this process: its exit code, stdout and stderr."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def usage_error(err: str, prog: str = "cnncompare") -> str:
    """Assert ``err`` is the command's usage line(s), then exactly one ``PROG: error: MESSAGE``
    line naming the problem, and no traceback; return that line."""
    lines = err.rstrip("\n").splitlines()
    assert lines and lines[0].startswith("usage: "), err
    assert lines[-1].startswith(f"{prog}: error: "), err
    assert sum(line.startswith(f"{prog}: error") for line in lines) == 1 and "Traceback" not in err, err
    return lines[-1]
