package feed

import (
	"os"
	"strings"
	"testing"
	"time"
)

func TestParseAccessLine(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, line string
		wantErr    string
		want       AccessRecord
	}{
		{"combined", `83.149.9.216 - - [17/May/2015:10:05:03 +0000] "GET /a.png HTTP/1.1" 200 203023 "http://x/" "Mozilla/5.0"`, "",
			AccessRecord{Host: "83.149.9.216", Time: time.Date(2015, 5, 17, 10, 5, 3, 0, time.UTC), Status: 200, Bytes: 203023}},
		{"dash bytes", `1.2.3.4 - - [17/May/2015:10:05:03 +0200] "HEAD / HTTP/1.1" 304 - "-" "-"`, "",
			AccessRecord{Host: "1.2.3.4", Time: time.Date(2015, 5, 17, 8, 5, 3, 0, time.UTC), Status: 304}},
		{"truncated user agent", `46.118.127.106 - - [20/May/2015:12:05:17 +0000] "GET /x.py HTTP/1.1" 200 235 "-" "Mozilla/5.0 (compatible`, "",
			AccessRecord{Host: "46.118.127.106", Time: time.Date(2015, 5, 20, 12, 5, 17, 0, time.UTC), Status: 200, Bytes: 235}},
		{"common format", `h - - [20/May/2015:12:05:17 +0000] "GET / HTTP/1.0" 200 5`, "",
			AccessRecord{Host: "h", Time: time.Date(2015, 5, 20, 12, 5, 17, 0, time.UTC), Status: 200, Bytes: 5}},
		{"garbage", `hello world`, "missing [time]", AccessRecord{}},
		{"bad time", `h - - [yesterday] "GET / HTTP/1.0" 200 5`, "bad time", AccessRecord{}},
		{"bad status", `h - - [20/May/2015:12:05:17 +0000] "GET / HTTP/1.0" abc 5`, "bad status", AccessRecord{}},
		{"negative bytes", `h - - [20/May/2015:12:05:17 +0000] "GET / HTTP/1.0" 200 -5`, "bad byte count", AccessRecord{}},
		{"no request", `h - - [20/May/2015:12:05:17 +0000] 200 5`, "missing quoted request", AccessRecord{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseAccessLine(tt.line)
			if tt.wantErr != "" {
				if err == nil || err.Error() != tt.wantErr {
					t.Fatalf("err %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("got %+v %v, want %+v", got, err, tt.want)
			}
		})
	}
}

func TestReadSharedAccessLog(t *testing.T) {
	t.Parallel()
	f, err := os.Open("../../../shared/data/access-logs/elastic-apache_logs.log")
	if err != nil {
		t.Fatalf("shared data: %v", err)
	}
	defer f.Close()
	res, err := Read(f, FormatAccessLog, "apache")
	if err != nil {
		t.Fatal(err)
	}
	// SOURCES.md: 10,000 lines, 1,753 distinct client IPs, 669 "-" byte counts.
	if res.Lines != 10000 || res.MalformedLines != 0 || res.Tenants != 1753 {
		t.Fatalf("lines %d malformed %d tenants %d", res.Lines, res.MalformedLines, res.Tenants)
	}
	var calls, egress int
	for _, e := range res.Events {
		switch e.Feature {
		case FeatureAPICalls:
			calls++
		case FeatureEgressBytes:
			egress++
		}
		if strings.Contains(e.Tenant, ".") {
			t.Fatalf("tenant %q leaks an address", e.Tenant)
		}
	}
	if calls != 10000 || egress != 10000-669 {
		t.Fatalf("calls %d egress %d", calls, egress)
	}
}

func TestMalformedLinesAreCountedNotFatal(t *testing.T) {
	t.Parallel()
	in := strings.Join([]string{
		`h - - [20/May/2015:12:05:17 +0000] "GET / HTTP/1.0" 200 5`,
		`garbage`,
		``,
		`h - - [20/May/2015:12:05:18 +0000] "GET / HTTP/1.0" 200 -`,
		`also garbage`,
	}, "\n")
	res, err := Read(strings.NewReader(in), FormatAccessLog, "t")
	if err != nil {
		t.Fatal(err)
	}
	if res.MalformedLines != 2 || len(res.Events) != 3 || res.FirstMalformed[0].Line != 2 || res.FirstMalformed[1].Line != 5 {
		t.Fatalf("%+v", res)
	}
}

func TestReadJSONL(t *testing.T) {
	t.Parallel()
	in := strings.Join([]string{
		`{"tenant":"org_1","event_id":"e1","feature":"api_calls","quantity":3,"timestamp":"2026-09-01T10:00:00Z"}`,
		`{"tenant":"org_1","event_id":"e2","feature":"api_calls","quantity":-1,"timestamp":"2026-09-01T10:00:00Z","corrects":"e1"}`,
		`{"tenant":"org_1","event_id":"e3","feature":"api_calls","timestamp":"2026-09-01T10:00:00Z"}`,
		`{"tenant":"","event_id":"e4","feature":"api_calls","quantity":1,"timestamp":"2026-09-01T10:00:00Z"}`,
		`{"tenant":"org_1","event_id":"e5","feature":"api_calls","quantity":1,"timestamp":"yesterday"}`,
		`{"tenant":"org_1","event_id":"e6","feature":"api_calls","quantity":1,"timestamp":"2026-09-01T10:00:00Z","extra":1}`,
		`not json`,
	}, "\n")
	res, err := Read(strings.NewReader(in), Detect([]byte(in)), "x")
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Events) != 2 || res.MalformedLines != 5 || res.Events[1].CorrectsEventID != "e1" {
		t.Fatalf("%+v", res)
	}
	var named bool
	for _, m := range res.FirstMalformed {
		named = named || (m.Line == 6 && strings.Contains(m.Reason, `unknown field "extra"`))
	}
	if !named {
		t.Fatalf("the unknown field is not named: %+v", res.FirstMalformed)
	}
}

func TestRebaseAndGenerate(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	a := Generate(7, 10, 100, now)
	b := Generate(7, 10, 100, now)
	if len(a.Events) != len(b.Events) || a.Events[5] != b.Events[5] {
		t.Fatal("generator not deterministic")
	}
	res := &Result{}
	res.Events = append(res.Events, a.Events...)
	res.Events[0].OccurredAt = now.Add(-48 * time.Hour)
	res.Rebase(now.Add(time.Hour))
	var newest time.Time
	for _, e := range res.Events {
		if e.OccurredAt.After(newest) {
			newest = e.OccurredAt
		}
	}
	if !newest.Equal(now.Add(time.Hour)) {
		t.Fatalf("newest %v", newest)
	}
}

// TestLongLine: a line longer than MaxLineBytes is one malformed line with
// its number; the lines around it are read; the run is not aborted.
func TestLongLine(t *testing.T) {
	t.Parallel()
	good := `10.0.0.1 - - [01/Sep/2026:10:00:00 +0000] "GET / HTTP/1.1" 200 512 "-" "curl"`
	for _, f := range []Format{FormatAccessLog, FormatJSONL} {
		in := good + "\n" + strings.Repeat("x", 2*MaxLineBytes) + "\n\n" + good + "\n" + strings.Repeat("y", MaxLineBytes+5)
		res, err := Read(strings.NewReader(in), f, "x")
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		var long2 bool
		for _, m := range res.FirstMalformed {
			long2 = long2 || (m.Line == 2 && strings.Contains(m.Reason, "longer than"))
		}
		if !long2 {
			t.Fatalf("%s: line 2 not reported as too long: %+v", f, res.FirstMalformed)
		}
		last := res.FirstMalformed[len(res.FirstMalformed)-1]
		if last.Line != 5 || !strings.Contains(last.Reason, "longer than") {
			t.Fatalf("%s: the unterminated long last line: %+v", f, last)
		}
		if f == FormatAccessLog && len(res.Events) != 4 { // two lines: api_calls + egress_bytes each
			t.Fatalf("access log around a long line: %d events", len(res.Events))
		}
	}
}

// TestDetect: the format is the one most of the first lines look like, so
// one malformed first line does not decide it; a .jsonl name decides alone.
func TestDetect(t *testing.T) {
	t.Parallel()
	access := `10.0.0.1 - - [01/Sep/2026:10:00:00 +0000] "GET / HTTP/1.1" 200 512 "-" "curl"`
	jsonl := `{"tenant":"org_1","event_id":"e1","feature":"api_calls","quantity":3,"timestamp":"2026-09-01T10:00:00Z"}`
	tests := []struct {
		name, head string
		want       Format
	}{
		{"in.log", access + "\n" + access, FormatAccessLog},
		{"in.txt", jsonl + "\n" + jsonl, FormatJSONL},
		{"in.txt", "garbage first line\n" + jsonl + "\n" + jsonl, FormatJSONL},
		{"in.txt", "{garbage\n" + access + "\n" + access, FormatAccessLog},
		{"in.jsonl", "garbage\nmore garbage", FormatJSONL},
		{"in.log", "", FormatAccessLog},
	}
	for _, tt := range tests {
		if got := DetectFile(tt.name, []byte(tt.head)); got != tt.want {
			t.Errorf("DetectFile(%q, %.20q…) = %s, want %s", tt.name, tt.head, got, tt.want)
		}
	}
}
