package feed

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/aurora-billing/aurora/shared/usage"
)

// Fuzz targets of the two feeds (go test -fuzz '^FuzzAccessLog$' ./demo/feed).
// Seeds: testdata/seed (copied from the shared data folder, see
// testdata/SOURCES.md) line by line and in chunks, and the hostile JSONL file.
// Regressions the fuzzer found live in testdata/fuzz/<target>/.

// seedLines adds each line of the seed files matching pattern, and the
// first few lines together, to f.
func seedLines(f *testing.F, pattern string, max int) {
	f.Helper()
	files, err := filepath.Glob(pattern)
	if err != nil || len(files) == 0 {
		f.Fatalf("no seed files %s (%v)", pattern, err)
	}
	for _, name := range files {
		data, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		lines := bytes.Split(data, []byte("\n"))
		for i, l := range lines {
			if i >= max {
				break
			}
			f.Add(l)
		}
		f.Add(bytes.Join(lines[:min(len(lines), 5)], []byte("\n")))
	}
}

// checkResult holds for every read of either format: the counts add up,
// every event is storable (usage.Event.Validate: valid UTF-8, no NUL, bounded
// text and quantity) and knows its line.
func checkResult(t *testing.T, data []byte, res *Result) {
	t.Helper()
	if len(res.EventLines) != len(res.Events) {
		t.Fatalf("%d events but %d event lines", len(res.Events), len(res.EventLines))
	}
	if res.MalformedLines > res.Lines {
		t.Fatalf("%d malformed of %d lines", res.MalformedLines, res.Lines)
	}
	if len(res.FirstMalformed) != min(res.MalformedLines, MaxReported) {
		t.Fatalf("%d reported of %d malformed", len(res.FirstMalformed), res.MalformedLines)
	}
	nonBlank := 0
	for _, l := range bytes.Split(data, []byte("\n")) {
		if len(bytes.TrimSpace(l)) > 0 {
			nonBlank++
		}
	}
	if res.Lines != nonBlank {
		t.Fatalf("Lines = %d, input has %d non-blank lines", res.Lines, nonBlank)
	}
	good := map[int]bool{}
	for i, ev := range res.Events {
		if err := ev.Validate(); err != nil {
			t.Fatalf("event %d accepted but invalid: %v", i, err)
		}
		for _, s := range []string{ev.Tenant, ev.EventID, ev.Feature, ev.CorrectsEventID} {
			if !utf8.ValidString(s) || strings.ContainsRune(s, 0) {
				t.Fatalf("event %d holds text Postgres cannot store: %q", i, s)
			}
		}
		n := res.LineOf(i)
		if n < 1 || n > bytes.Count(data, []byte("\n"))+1 {
			t.Fatalf("event %d on line %d", i, n)
		}
		good[n] = true
	}
	for _, m := range res.FirstMalformed {
		if good[m.Line] {
			t.Fatalf("line %d both malformed (%s) and staged", m.Line, m.Reason)
		}
		if m.Reason == "" || !utf8.ValidString(m.Reason) {
			t.Fatalf("line %d malformed with reason %q", m.Line, m.Reason)
		}
	}
	if res.Lines != res.MalformedLines+len(good) {
		t.Fatalf("%d lines = %d malformed + %d good?", res.Lines, res.MalformedLines, len(good))
	}
}

// FuzzAccessLog: any bytes read as an access log. Besides checkResult, a
// line ParseAccessLine accepts has a status of 100..599 and a non-negative
// byte count, and yields one api_calls event (plus egress when bytes > 0)
// under an anonymised tenant: no client host reaches an event.
func FuzzAccessLog(f *testing.F) {
	seedLines(f, "testdata/seed/*.log", 200)
	f.Add([]byte(`1.2.3.4 - - [17/May/2015:10:05:03 +0000] "GET / HTTP/1.1" 200 -`))
	f.Add([]byte("\x00 - - [17/May/2015:10:05:03 +0000] \"GET /\xff HTTP/1.1\" 200 9223372036854775807"))
	f.Fuzz(func(t *testing.T, data []byte) {
		res, err := Read(bytes.NewReader(data), FormatAccessLog, "fuzz")
		if err != nil {
			t.Fatalf("read from memory failed: %v", err)
		}
		checkResult(t, data, res)
		for i, ev := range res.Events {
			if !strings.HasPrefix(ev.Tenant, "tn_") || len(ev.Tenant) != 15 {
				t.Fatalf("event %d tenant %q is not anonymised", i, ev.Tenant)
			}
			if ev.Feature != FeatureAPICalls && ev.Feature != FeatureEgressBytes {
				t.Fatalf("event %d feature %q", i, ev.Feature)
			}
			if ev.Feature == FeatureAPICalls && ev.Quantity != 1 || ev.Feature == FeatureEgressBytes && ev.Quantity <= 0 {
				t.Fatalf("event %d %s quantity %d", i, ev.Feature, ev.Quantity)
			}
		}
		for _, line := range strings.Split(string(data), "\n") {
			rec, err := ParseAccessLine(strings.TrimSpace(line))
			if err != nil {
				continue
			}
			if rec.Status < 100 || rec.Status > 599 || rec.Bytes < 0 || rec.Host == "" || rec.Time.Location() != time.UTC {
				t.Fatalf("accepted %q as %+v", line, rec)
			}
		}
		_ = Detect(data)
	})
}

// FuzzJSONL: any bytes read as JSONL. Besides checkResult, an accepted line
// was valid UTF-8 and one JSON object, and its event round-trips: written
// back as a JSONL line and read again it is the same event.
func FuzzJSONL(f *testing.F) {
	seedLines(f, "testdata/seed/*.jsonl", 30)
	seedLines(f, "../testdata/hostile.jsonl", 100)
	f.Add([]byte(`{"tenant":"org_a","event_id":"c-1","feature":"api_calls","quantity":-2,"timestamp":"2026-09-01T10:00:00+02:00","corrects":"e-1"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		res, err := Read(bytes.NewReader(data), FormatJSONL, "fuzz")
		if err != nil {
			t.Fatalf("read from memory failed: %v", err)
		}
		checkResult(t, data, res)
		lines := bytes.Split(data, []byte("\n"))
		for i, ev := range res.Events {
			line := bytes.TrimSpace(lines[res.LineOf(i)-1])
			if !utf8.Valid(line) || line[0] != '{' {
				t.Fatalf("event %d from line %q", i, line)
			}
			back := roundTrip(t, ev)
			if back != ev {
				t.Fatalf("event %d does not round-trip:\n got %+v\nwant %+v", i, back, ev)
			}
		}
		_ = Detect(data)
	})
}

// roundTrip writes ev as a JSONL line and reads it back.
func roundTrip(t *testing.T, ev usage.Event) usage.Event {
	t.Helper()
	rec := jsonlRecord{Tenant: ev.Tenant, EventID: ev.EventID, Feature: ev.Feature, Quantity: &ev.Quantity,
		Timestamp: ev.OccurredAt.Format(time.RFC3339Nano)}
	if ev.CorrectsEventID != "" {
		rec.Corrects = &ev.CorrectsEventID
	}
	line, err := json.Marshal(rec)
	if err != nil {
		t.Fatal(err)
	}
	res, err := Read(bytes.NewReader(line), FormatJSONL, "fuzz")
	if err != nil || len(res.Events) != 1 {
		t.Fatalf("re-reading %s: %v, %+v", line, err, res)
	}
	return res.Events[0]
}
