package chaos

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// plantedBug is a deliberate bug planted in a copy of the source tree: the
// chaos run built from that copy must fail with a failure naming it.
type plantedBug struct {
	name  string
	file  string      // relative to the repository root
	edits [][2]string // each old text must occur exactly once in file
	// want: a substring of the failure the checker must report.
	want string
	// the faults that exercise the bug
	weights map[FaultKind]float64
	emu     string
}

// plantedBugs are the bugs TestPlantedBugs plants, one run each.
var plantedBugs = []plantedBug{
	{
		name: "fence", // a deliverer that skips the lease-token fence
		file: "deliverer/queries.go",
		edits: [][2]string{{"WHERE o.id = r.id AND o.state = 'leased' AND o.lease_token = r.token",
			"WHERE o.id = r.id"}},
		want:    "after their lease was taken over",
		weights: map[FaultKind]float64{FaultStopLong: 0.5, FaultKillOwner: 0.3, FaultStopCont: 0.2},
	},
	{
		name: "msgid", // a relay that forgets the Nats-Msg-Id
		file: "relay/batch.go",
		edits: [][2]string{{"\t\t\tjetstream.MsgIDHeader:          []string{outbox.MsgID(c.key, c.dispatch)},\n",
			""}},
		want: "published twice",
		// a lost PubAck is what makes a relay publish a dispatch again while
		// the item is still due: NATS frozen past the publish timeout (the
		// message is stored when it thaws), or restarted. A relay killed
		// between its PubAcks and its commit rarely does: the deliverer has
		// usually taken the item before the restarted relay comes back.
		weights: map[FaultKind]float64{FaultFreezeNATS: 0.4, FaultRestartNATS: 0.2, FaultKillRelay: 0.2, FaultKillPostgres: 0.2},
	},
	{
		name: "identifier", // a deliverer that sends a fresh identifier and idempotency key per attempt
		file: "deliverer/stripeexport/exporter.go",
		edits: [][2]string{
			{"\tp := &stripe.BillingMeterEventParams{", "\tnonce := strconv.FormatInt(time.Now().UnixNano(), 36)\n\tp := &stripe.BillingMeterEventParams{"},
			{"\t\tIdentifier: stripe.String(r.Key),", "\t\tIdentifier: stripe.String(r.Key + nonce),"},
			{"\tp.SetIdempotencyKey(r.Key)\n\treturn p", "\tp.SetIdempotencyKey(r.Key + nonce)\n\treturn p"},
		},
		want:    "quantity: staged",
		weights: map[FaultKind]float64{FaultKillOwner: 0.5, FaultKillRelay: 0.5},
		emu:     "latency=20ms,drop-after-apply=0.05,cut-after-apply=0.05",
	},
}

// TestPlantedBugs shows the checker catches real bugs: for each planted
// bug it copies the source tree, plants the bug, builds the binaries from
// the copy and runs a shortened short mode (1,500 items over 75 s, the
// faults that exercise the bug), which must fail naming it. About two
// minutes per bug; it runs only when AURORA_CHAOS_PLANTED is "all" or a
// comma-separated list of names (fence, msgid, identifier).
func TestPlantedBugs(t *testing.T) {
	which := os.Getenv("AURORA_CHAOS_PLANTED")
	if which == "" {
		t.Skip("set AURORA_CHAOS_PLANTED=all (or fence,msgid,identifier) to plant bugs and check the harness catches each (about 2 min each)")
	}
	root := repoRoot(t)
	for _, bug := range plantedBugs {
		if which != "all" && !strings.Contains(","+which+",", ","+bug.name+",") {
			continue
		}
		t.Run(bug.name, func(t *testing.T) {
			src := filepath.Join(t.TempDir(), "src")
			if err := copyTree(root, src); err != nil {
				t.Fatal(err)
			}
			if err := plant(src, bug); err != nil {
				t.Fatal(err)
			}
			o := Short(11)
			o.Items, o.StageFor, o.Weights, o.Src = 1500, 75*time.Second, bug.weights, src
			if bug.emu != "" {
				o.EmulatorFaults = bug.emu
			}
			o.Command = "AURORA_CHAOS_PLANTED=" + bug.name + " go test -count=1 -run TestPlantedBugs -timeout 30m ./chaos"
			o.Progress = testWriter{t}
			o.Dir = t.TempDir()
			rep, err := Run(context.Background(), o)
			if !errors.Is(err, ErrInvariant) {
				t.Fatalf("planted bug %s: the run did not fail an invariant (err %v)", bug.name, err)
			}
			for _, f := range rep.Failures {
				if strings.Contains(f, bug.want) {
					t.Logf("planted bug %s caught: %s (all failures: %v)", bug.name, f, rep.Failures)
					return
				}
			}
			t.Fatalf("planted bug %s: failures %v, none says %q", bug.name, rep.Failures, bug.want)
		})
	}
}

// plant applies bug's edits to its file under src; an edit whose old text
// is not there exactly once is an error (the bug no longer applies).
func plant(src string, bug plantedBug) error {
	path := filepath.Join(src, bug.file)
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	s := string(b)
	for _, e := range bug.edits {
		if n := strings.Count(s, e[0]); n != 1 {
			return errors.New("planted bug " + bug.name + ": " + strconv.Itoa(n) + " occurrences of " + strconv.Quote(e[0]) + " in " + bug.file)
		}
		s = strings.Replace(s, e[0], e[1], 1)
	}
	return os.WriteFile(path, []byte(s), 0o644)
}

// repoRoot is the directory holding go.work (the repository root).
func repoRoot(t *testing.T) string {
	out, err := exec.Command("go", "env", "GOWORK").Output()
	if err != nil || strings.TrimSpace(string(out)) == "" {
		t.Fatalf("go env GOWORK: %v %q", err, out)
	}
	return filepath.Dir(strings.TrimSpace(string(out)))
}

// copyTree copies the regular files under from to to, without .git.
func copyTree(from, to string) error {
	return filepath.WalkDir(from, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(from, path)
		if d.IsDir() {
			if d.Name() == ".git" {
				return filepath.SkipDir
			}
			return os.MkdirAll(filepath.Join(to, rel), 0o755)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(to, rel), b, 0o644)
	})
}

func TestPlantedBugsApply(t *testing.T) {
	root := repoRoot(t)
	for _, bug := range plantedBugs {
		t.Run(bug.name, func(t *testing.T) {
			b, err := os.ReadFile(filepath.Join(root, bug.file))
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range bug.edits {
				if n := strings.Count(string(b), e[0]); n != 1 {
					t.Fatalf("%d occurrences of %q in %s: the planted bug no longer applies; update it", n, e[0], bug.file)
				}
			}
		})
	}
}
