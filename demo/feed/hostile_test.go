package feed

import (
	"os"
	"slices"
	"strings"
	"testing"
)

// The hostile file (demo/testdata/hostile.jsonl): every bad line is counted
// malformed with its line number and a reason that names the problem, and
// the good lines around it are kept with their line numbers.
func TestHostileJSONL(t *testing.T) {
	t.Parallel()
	f, err := os.Open("../testdata/hostile.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	res, err := Read(f, FormatJSONL, "hostile")
	if err != nil {
		t.Fatal(err)
	}
	want := map[int]string{
		2:  "tenant: must not contain NUL",
		3:  "tenant: is 300 bytes",
		4:  "not valid UTF-8",
		5:  "not valid UTF-8",
		7:  "trailing data",
		8:  "quantity: has more than 15 significant digits",
		9:  "quantity: must be >= 0",
		10: "tenant: must not contain U+FFFD",
		11: "trailing data",
		15: "tenant: must not contain NUL",
	}
	if res.MalformedLines != len(want) || len(res.FirstMalformed) != len(want) {
		t.Fatalf("malformed %d %+v, want %d", res.MalformedLines, res.FirstMalformed, len(want))
	}
	for _, m := range res.FirstMalformed {
		if w, ok := want[m.Line]; !ok || !strings.Contains(m.Reason, w) {
			t.Errorf("line %d: reason %q, want %q", m.Line, m.Reason, w)
		}
	}
	// Lines 13 (an event id reused with other content) and 14 (a correction
	// of an unknown event) are well formed: the usage API refuses them.
	if !slices.Equal(res.EventLines, []int{1, 6, 12, 13, 14, 16}) || len(res.Events) != 6 {
		t.Fatalf("event lines %v", res.EventLines)
	}
	if res.Tenants != 3 || res.Lines != 16 {
		t.Fatalf("tenants %d lines %d, want 3 and 16", res.Tenants, res.Lines)
	}
	for i, ev := range res.Events {
		if res.LineOf(i) != res.EventLines[i] || ev.Validate() != nil {
			t.Fatalf("event %d: line %d, %v", i, res.LineOf(i), ev.Validate())
		}
	}
}

// One JSON value per line, nothing after it; invalid UTF-8 is refused.
func TestJSONLLineShape(t *testing.T) {
	t.Parallel()
	const good = `{"tenant":"t","event_id":"e","feature":"api_calls","quantity":1,"timestamp":"2026-09-01T10:00:00Z"}`
	tests := []struct {
		name, line, reason string // reason "" = accepted
	}{
		{"good", good, ""},
		{"trailing spaces", good + "   ", ""},
		{"trailing garbage", good + " trailing garbage", "trailing data"},
		{"second object", good + good, "trailing data"},
		{"trailing comma", good + ",", "trailing data"},
		{"array", "[" + good + "]", "not a JSON object"},
		{"null", "null", "not a JSON object"},
		{"string", `"x"`, "not a JSON object"},
		{"invalid UTF-8 in a value", strings.Replace(good, `"t"`, "\"t\xff\"", 1), "not valid UTF-8"},
		{"overlong encoding", strings.Replace(good, `"t"`, "\"t\xc0\xaf\"", 1), "not valid UTF-8"},
		{"20-digit quantity", strings.Replace(good, `"quantity":1`, `"quantity":99999999999999999999`, 1), "invalid JSON object"},
		{"fractional quantity", strings.Replace(good, `"quantity":1`, `"quantity":1.5`, 1), "invalid JSON object"},
		{"16-digit quantity", strings.Replace(good, `"quantity":1`, `"quantity":1000000000000000`, 1), "15 significant digits"},
		{"control character tenant", strings.Replace(good, `"t"`, `"t\u0007"`, 1), "control characters"},
	}
	for _, tt := range tests {
		res, err := Read(strings.NewReader(tt.line+"\n"), FormatJSONL, "x")
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case tt.reason == "" && (len(res.Events) != 1 || res.MalformedLines != 0):
			t.Errorf("%s: %+v, want accepted", tt.name, res.FirstMalformed)
		case tt.reason != "" && (len(res.Events) != 0 || res.MalformedLines != 1 || !strings.Contains(res.FirstMalformed[0].Reason, tt.reason)):
			t.Errorf("%s: events %d malformed %+v, want reason %q", tt.name, len(res.Events), res.FirstMalformed, tt.reason)
		}
	}
}
