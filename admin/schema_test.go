package admin

import (
	"strings"
	"testing"

	"github.com/aurora-billing/aurora/migrations/dbtest"
)

// A command that writes refuses (exit 5, naming the migration) a database
// not migrated to this build or whose recorded checksum of a migration was
// altered; a read-only command warns and goes on; migrate is not judged.
func TestCommandsRefuseADatabaseNotOfThisBuild(t *testing.T) {
	mismatched := dbtest.NewAlteredDatabase(t)
	empty := dbtest.NewEmptyDatabase(t)
	const file = "00017_take_bumps_dispatch.sql"
	tests := []struct {
		name     string
		url      string
		args     []string
		code     int
		inStderr string
	}{
		{"write on altered checksum", mismatched, []string{"events", "cleanup-stuck", "--yes"}, ExitRefused, file},
		{"write on altered checksum", mismatched, []string{"reconcile", "resolve", "1", "--resolution", "x"}, ExitRefused, file},
		{"read on altered checksum warns", mismatched, []string{"recovery", "list"}, ExitOK, "warning: migrations: the database schema does not match this build: migration " + file},
		{"write on a never-migrated database", empty, []string{"events", "cleanup-stuck", "--yes"}, ExitRefused, "not migrated"},
		{"migrate status is not judged", mismatched, []string{"migrate", "status"}, ExitOK, ""},
		{"fresh database", dbtest.NewDatabase(t), []string{"events", "cleanup-stuck", "--yes"}, ExitOK, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, _, stderr := runCtl(t, map[string]string{"AURORA_DATABASE_URL": tt.url}, tt.args...)
			if code != tt.code || (tt.inStderr == "" && stderr != "") || !strings.Contains(stderr, tt.inStderr) {
				t.Fatalf("%v: exit %d stderr %q, want exit %d and %q", tt.args, code, stderr, tt.code, tt.inStderr)
			}
		})
	}
}
