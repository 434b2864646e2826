package field

import (
	"strings"
	"testing"
)

func TestText(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, v string
		max     int
		want    string // a substring of the reason; "" = accepted
	}{
		{"plain", "org_123", 255, ""},
		{"unicode", "org_café_日本", 255, ""},
		{"exactly the limit", strings.Repeat("a", 255), 255, ""},
		{"empty", "", 255, "must not be empty"},
		{"blank", " \t", 255, "must not be empty"},
		{"one byte over", strings.Repeat("a", 256), 255, "longer than 255"},
		{"multi-byte over in bytes", strings.Repeat("é", 128), 255, "is 256 bytes"},
		{"NUL", "org_\x00b", 255, "NUL"},
		{"invalid UTF-8", "org_\xff", 255, "valid UTF-8"},
		{"U+FFFD", "org_\uFFFD", 255, "U+FFFD"},
		{"newline", "org\n1", 255, "control"},
		{"DEL", "org\x7f", 255, "control"},
		{"C1 control", "org\u0085", 255, "control"},
	}
	for _, tt := range tests {
		got := Text(tt.v, tt.max)
		if (tt.want == "") != (got == "") || !strings.Contains(got, tt.want) {
			t.Errorf("%s: Text = %q, want %q", tt.name, got, tt.want)
		}
	}
	if OptionalText("", 10) != "" || OptionalText("a\x00", 10) == "" {
		t.Error("OptionalText: empty must pass, NUL must not")
	}
}

func TestFeature(t *testing.T) {
	t.Parallel()
	for v, ok := range map[string]bool{
		"api_calls": true, "egress.bytes-v2": true, "A1": true, strings.Repeat("a", 100): true,
		"": false, "_x": false, "api calls": false, "api:calls": false, strings.Repeat("a", 101): false, "é": false,
	} {
		if got := Feature(v); (got == "") != ok {
			t.Errorf("Feature(%q) = %q, want ok=%v", v, got, ok)
		}
	}
}

func TestQuantity(t *testing.T) {
	t.Parallel()
	tests := []struct {
		q        int64
		negative bool
		ok       bool
	}{
		{0, false, true},
		{1, false, true},
		{MaxQuantity, false, true},
		{MaxQuantity + 1, false, false},
		{9223372036854775807, false, false},
		{-1, false, false},
		{-1, true, true},
		{-MaxQuantity, true, true},
		{-MaxQuantity - 1, true, false},
		{-9223372036854775808, true, false},
	}
	for _, tt := range tests {
		if got := Quantity(tt.q, tt.negative); (got == "") != tt.ok {
			t.Errorf("Quantity(%d, %v) = %q, want ok=%v", tt.q, tt.negative, got, tt.ok)
		}
	}
	if len("999999999999999") != 15 || MaxQuantity >= 1<<53 {
		t.Fatal("MaxQuantity must have 15 digits and be exact in a float64")
	}
}

func TestMetadata(t *testing.T) {
	t.Parallel()
	if MetadataKey(strings.Repeat("k", 40)) != "" || MetadataKey(strings.Repeat("k", 41)) == "" {
		t.Error("metadata keys: 40 characters pass, 41 do not")
	}
	if MetadataValue(strings.Repeat("é", 500)) != "" || MetadataValue(strings.Repeat("v", 501)) == "" {
		t.Error("metadata values: 500 characters pass (in any script), 501 do not")
	}
	if MetadataValue("a\x00") == "" {
		t.Error("metadata values: NUL must not pass")
	}
}
