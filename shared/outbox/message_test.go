package outbox

import (
	"errors"
	"strings"
	"testing"
)

func TestTenantToken(t *testing.T) {
	t.Parallel()
	tests := []struct{ tenant, want string }{
		{"org_123", "org_123"},
		{"Org-9", "Org-9"},
	}
	for _, tt := range tests {
		if got := TenantToken(tt.tenant); got != tt.want {
			t.Errorf("TenantToken(%q) = %q", tt.tenant, got)
		}
	}
	for _, odd := range []string{"66.249.73.135", "a b", "a.*>", "", "~x", strings.Repeat("a", 65)} {
		got := TenantToken(odd)
		if !strings.HasPrefix(got, "~") || len(got) != 25 || strings.ContainsAny(got, ". *>") {
			t.Errorf("TenantToken(%q) = %q, want ~ + 24 hex", odd, got)
		}
		if TenantToken(odd) != got {
			t.Errorf("TenantToken(%q) not stable", odd)
		}
	}
	if Subject("stripe_meter_events", "66.249.73.135") != "aurora.outbox.stripe_meter_events."+TenantToken("66.249.73.135") {
		t.Error("subject shape")
	}
}

func TestMessageRoundTrip(t *testing.T) {
	t.Parallel()
	m := Message{ItemID: 7, Key: strings.Repeat("a", 64), Dispatch: 2}
	got, err := DecodeMessage(m.Encode())
	if err != nil || got != m {
		t.Fatalf("got %+v, %v", got, err)
	}
	for _, bad := range []string{"", "{", `{"item_id":0}`, `{"item_id":1,"key":"x","dispatch":1}`, `[]`} {
		if _, err := DecodeMessage([]byte(bad)); !errors.Is(err, ErrBadMessage) {
			t.Errorf("%q: got %v", bad, err)
		}
	}
	if MsgID(m.Key, 3) != m.Key+".3" {
		t.Error("msg id shape")
	}
}
