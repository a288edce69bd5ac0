"""``python -m sgdiff demo``: see :mod:`sgdiff.demo`."""
import sys


def main() -> int:
    commands = {"demo": "sgdiff.demo"}
    if len(sys.argv) < 2 or sys.argv[1] not in commands:
        print(f"usage: python -m sgdiff {{{','.join(commands)}}} [options]  (--help for each)")
        return 2
    import importlib

    return importlib.import_module(commands[sys.argv[1]]).main(sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
