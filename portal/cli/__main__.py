"""`python -m portal.cli`: the same as the `devcloud` console script."""

from .main import main

if __name__ == "__main__":
    main()
