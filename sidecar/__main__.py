from sidecar.lifecycle import catch_early_stop

catch_early_stop()  # before the heavy imports: a SIGTERM during start-up is a clean stop

from sidecar.cli import main  # noqa: E402 - after the signal handler, on purpose

raise SystemExit(main())
