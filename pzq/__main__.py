"""`python -m pzq`: the same as the `pzq` command (cli.main)."""

from pzq.cli import main

if __name__ == "__main__":
    main()
