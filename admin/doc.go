// Package admin is auroractl, the operator CLI: migrations, the idempotency
// key, recovery of uncertain and quarantined items, cutover, the inbox's
// dead letters and the domain events' (auroractl events).
//
// Every write command is read-only unless --yes is given; without it, it
// prints the row, the change it would make and the expected-state map it
// would send, and exits 0 without writing. Every command takes --json.
//
// Exit codes (stable, for scripts):
//
//	0  success (or a dry run)
//	1  unexpected failure (database unreachable, bug)
//	2  invalid input (bad flags or arguments)           ExitInvalidInput
//	3  not found                                        ExitNotFound
//	4  expected state mismatch: the row moved           ExitStateMismatch
//	5  refused by a rule (mapping_changed, already_scheduled, …) ExitRefused
//	6  auroractl status: measured, and a figure needs a person  ExitAttention
//
// A command that writes refuses (5), naming the migrations, a database
// with migrations of this build not applied or applied from other files
// (the check every service makes at start); read-only commands (status,
// list, inspect, actions) print a warning to stderr and go on; migrate and
// key are not judged.
//
// An AURORA_* variable in the environment that no aurora component reads
// (a misspelling such as AURORA_STRIPE_ACCONT) is warned about on stderr,
// one line each naming the closest known variable, and otherwise ignored:
// the exit code is unchanged.
package admin
