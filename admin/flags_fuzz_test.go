package admin

import (
	"bytes"
	"errors"
	"os"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/aurora-billing/aurora/shared/field"
	"github.com/spf13/pflag"
)

// FuzzFlags: any command line, parsed as auroractl parses it up to the point
// a command would run (go test -fuzz '^FuzzFlags$' ./admin). The input is
// the arguments separated by \x1e (so values may hold newlines and NUL).
// Seeds: real command lines with ids from testdata/seed/ids.txt (taken from
// the shared data folder, see testdata/seed/SOURCES.md); regressions in
// testdata/fuzz/FuzzFlags/.
//
// Invariants: parsing never panics; a refused flag is an ExitInvalidInput
// error naming a flag or an argument's position, never quoting a long value;
// and a command line that passes the checks leaves every set string flag and
// every positional argument storable: identifier flags pass their field
// rule, free text and arguments are valid UTF-8 without NUL.
func FuzzFlags(f *testing.F) {
	data, err := os.ReadFile("testdata/seed/ids.txt")
	if err != nil {
		f.Fatal(err)
	}
	ids := strings.Fields(string(data))
	lines := [][]string{
		{"provision", "customer", "--account", ids[3], "--tenant", "org_123", "--customer", ids[0]},
		{"provision", "account", "--account", ids[3]},
		{"provision", "meter", "--account", ids[3], "--feature", "api_calls", "--event-name", ids[6]},
		{"key", "--tenant", "org_1", "--subject-kind", "event", "--subject-ref", "event:" + ids[7], "--destination-account", ids[3]},
		{"recovery", "show", "--tenant", "org_\x00"},
		{"inbox", "inspect", "evt_\x00"},
		{"inbox", "requeue", ids[4], "--actor", "ops", "--reason", "re-created — 再作成"},
		{"cutover", "reschedule", "--feature", "api_calls", "--at", "2026-10-01T00:00:00Z", "--expect-watermark", "2026-09-01T00:00:00Z", "--reason", "r", "--evidence", "e"},
		{"recovery", "accept", "1", "--provider-ref", ids[5], "--expect-provider-ref=" + ids[1], "--reason", "\xff"},
		{"status", "--validate"},
		{"--help"},
	}
	for _, l := range lines {
		f.Add(strings.Join(l, "\x1e"))
	}
	f.Fuzz(func(t *testing.T, line string) {
		args := strings.Split(line, "\x1e")
		root := NewRootCmd(IO{Out: &bytes.Buffer{}, Err: &bytes.Buffer{}})
		cmd, rest, err := root.Find(args)
		if err != nil {
			return // unknown command: cobra's error, exit 2 in Main
		}
		if err := cmd.ParseFlags(rest); err != nil {
			return // a flag pflag refuses: exit 2 in Main (SetFlagErrorFunc)
		}
		err = checkFlags(cmd)
		if err == nil {
			err = checkArgs(cmd.Flags().Args())
		}
		if err != nil {
			var ee *ExitError
			if !errors.As(err, &ee) || ee.Code != ExitInvalidInput || !strings.HasPrefix(ee.Msg, "--") && !strings.HasPrefix(ee.Msg, "argument ") {
				t.Fatalf("refusal %v is not an invalid-input error naming the flag", err)
			}
			cmd.Flags().Visit(func(fl *pflag.Flag) {
				if v := fl.Value.String(); len(v) >= 24 && strings.Contains(ee.Msg, v) {
					t.Fatalf("refusal %q quotes the value of --%s", ee.Msg, fl.Name)
				}
			})
			return
		}
		for i, a := range cmd.Flags().Args() {
			if !utf8.ValidString(a) || strings.ContainsRune(a, 0) {
				t.Fatalf("argument %d %q accepted", i+1, a)
			}
		}
		cmd.Flags().Visit(func(fl *pflag.Flag) {
			if fl.Value.Type() != "string" {
				return
			}
			v := fl.Value.String()
			if rule, ok := flagRules[fl.Name]; ok {
				if r := rule(v); r != "" {
					t.Fatalf("--%s accepted although %s", fl.Name, r)
				}
				if r := field.Text(v, 1<<20); r != "" && fl.Name != "feature" {
					t.Fatalf("--%s accepted although %s", fl.Name, r)
				}
			}
			if !utf8.ValidString(v) || strings.ContainsRune(v, 0) {
				t.Fatalf("--%s %q accepted", fl.Name, v)
			}
		})
	})
}
