"""Run a script with faulthandler dumping every thread's stack after AFTER seconds, and again every AFTER seconds:
where a benchmark that overran its time limit was waiting.
  python benchmarks/probes/run_with_stacks.py AFTER script.py [its args]"""
import faulthandler
import runpy
import sys


def main() -> None:
    faulthandler.dump_traceback_later(float(sys.argv[1]), repeat=True)
    sys.argv = sys.argv[2:]
    runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
