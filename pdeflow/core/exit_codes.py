"""The exit codes of every ``pdeflow`` command, defined once: the CLI returns them, the driver's run result
carries them, and :data:`HELP` is the text every command's ``--help`` ends with."""
from __future__ import annotations

EXIT_OK = 0
EXIT_CHECK_FAILED = 1   # compare, validate: the files were read and a check failed
EXIT_BAD_INPUT = 2      # config, files, arguments: one line on stderr, no output touched
EXIT_FAILED = 3         # non-finite state, failed inner solve, write error, accuracy lost (run.accuracy = "stop"); a
                        # stage of pdeflow report failed
EXIT_SIGINT = 130       # 128 + SIGINT: the state is checkpointed
EXIT_SIGTERM = 143      # 128 + SIGTERM: the state is checkpointed
EXIT_PIPE = 141         # 128 + SIGPIPE: the reader of the output went away; the work and its files are complete

HELP = f"""exit codes:
  {EXIT_OK:<4d} done
  {EXIT_CHECK_FAILED:<4d} a check failed (compare, validate)
  {EXIT_BAD_INPUT:<4d} bad input: one line on stderr naming the problem; no output file created or touched
  {EXIT_FAILED:<4d} the run failed: non-finite state, failed inner solve, the file could not be written
       (disk full), or accuracy was lost with run.accuracy = "stop"; every frame committed before is
       kept, continue with --resume; report: a stage failed (the page, report.json and the summary say
       which, with its message)
  {EXIT_SIGINT:<4d} interrupted by SIGINT, {EXIT_SIGTERM} by SIGTERM; the state is checkpointed, continue with --resume
  {EXIT_PIPE:<4d} the reader of the output went away (| head): the rest of the output is dropped; the command
       still did all its work and wrote its files whole
"""

__all__ = ["EXIT_OK", "EXIT_CHECK_FAILED", "EXIT_BAD_INPUT", "EXIT_FAILED", "EXIT_SIGINT", "EXIT_SIGTERM", "EXIT_PIPE",
           "HELP"]
