package admin

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/aurora-billing/aurora/migrations"
	"github.com/spf13/cobra"
)

// schemaFree lists the commands that never judge the schema: migrate
// (it migrates, and refuses a mismatched database itself) and key (no
// database).
var schemaFree = []string{"migrate", "key", "help", "completion"}

// readOnly lists the commands that only read: on a database not of this
// build they warn and go on; every other command that reaches the database
// refuses (ExitRefused).
var readOnly = map[string]bool{
	"status":            true,
	"cutover status":    true,
	"cutover actions":   true,
	"events list":       true,
	"events inspect":    true,
	"inbox inventory":   true,
	"inbox list":        true,
	"inbox inspect":     true,
	"inbox plans list":  true,
	"reconcile list":    true,
	"reconcile inspect": true,
	"recovery list":     true,
	"recovery inspect":  true,
	"recovery actions":  true,
}

// requireSchema is the start check every aurora service makes
// (migrations.Require), for the command cmd: a command that writes
// returns an ExitError (ExitRefused) naming the migrations when the
// database at AURORA_DATABASE_URL is not migrated to this build or was
// migrated from other files; a read-only command prints a warning to
// stderr and goes on. A database that cannot be asked is left to the
// command, which reports it.
func requireSchema(cmd *cobra.Command) error {
	path := strings.TrimSpace(strings.TrimPrefix(cmd.CommandPath(), cmd.Root().Name()))
	if path == "" || !cmd.Runnable() {
		return nil
	}
	for _, p := range schemaFree {
		if path == p || strings.HasPrefix(path, p+" ") {
			return nil
		}
	}
	url, err := databaseURL()
	if err != nil {
		return nil // the command reports the configuration
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), 10*time.Second)
	defer cancel()
	err = migrations.Require(ctx, url)
	if err == nil || !migrations.Refused(err) {
		return nil
	}
	if readOnly[path] {
		fmt.Fprintf(cmd.ErrOrStderr(), "auroractl: warning: %v; what follows may be wrong\n", err)
		return nil
	}
	return &ExitError{Code: ExitRefused, Msg: fmt.Sprintf("refusing %q: %v", path, err), Err: err}
}
