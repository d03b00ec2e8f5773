"""The ``airflow pglogical`` command group. Imports nothing heavy: Airflow loads this for every CLI call."""

from __future__ import annotations

from airflow.cli.cli_config import ActionCommand, Arg, GroupCommand, lazy_load_command

ARG_CONN_ID = Arg(("--conn-id",), required=True, help="the publisher's Airflow postgres connection")
ARG_STAGING = Arg(("--staging-root",), required=True,
                  help="the pipeline's staging root URI (file:///…, s3://…), as given to its operators")
ARG_PIPELINE = Arg(("--pipeline",), required=True, help="the pipeline's name")
ARG_OUTPUT = Arg(("-o", "--output"), choices=("table", "json"), default="table", help="output format")
ARG_YES = Arg(("--yes",), action="store_true", default=False, help="really drop (without it: only show what would go)")

PGLOGICAL_COMMANDS = (
    ActionCommand(
        name="status",
        help="Show a pipeline: slot lag and retained WAL, last batch, applied position per table",
        func=lazy_load_command("airflow_provider_pglogical.cli.commands.status"),
        args=(ARG_CONN_ID, ARG_STAGING, ARG_PIPELINE, ARG_OUTPUT),
    ),
    ActionCommand(
        name="drop",
        help="Drop a pipeline safely: its slot first, then its staging; the lakehouse is kept",
        func=lazy_load_command("airflow_provider_pglogical.cli.commands.drop"),
        args=(ARG_CONN_ID, ARG_STAGING, ARG_PIPELINE, ARG_YES),
    ),
)


def get_pglogical_cli_commands() -> list:
    """The provider's CLI commands (named in ``get_provider_info()["cli"]``)."""
    return [GroupCommand(name="pglogical", help="PostgreSQL logical replication pipelines",
                         subcommands=PGLOGICAL_COMMANDS)]


def main(argv: list[str] | None = None) -> None:
    """``airflow-pglogical …``: the same commands as a console script, for Airflow versions that do
    not load CLI commands from providers (before 3.1) and for shells without the airflow CLI."""
    import argparse

    parser = argparse.ArgumentParser(prog="airflow-pglogical", description="PostgreSQL logical replication pipelines")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for command in PGLOGICAL_COMMANDS:
        sub = subparsers.add_parser(command.name, help=command.help)
        for arg in command.args:
            arg.add_to_parser(sub)
        sub.set_defaults(func=command.func)
    args = parser.parse_args(argv)
    args.func(args)
