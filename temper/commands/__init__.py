"""One module per `temper` command group; see temper/cli.py."""
