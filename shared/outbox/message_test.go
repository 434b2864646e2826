package outbox

import (
	"errors"
	"fmt"
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

func TestBatchRoundTripAndValidation(t *testing.T) {
	t.Parallel()
	key := strings.Repeat("b", 64)
	good := BatchEntry{Subject: PartitionSubject("stripe_meter_events", "org_1", 3), Message: Message{ItemID: 9, Key: key, Dispatch: 1, Lane: "l"}}
	b := Batch{Items: []BatchEntry{good, {Subject: good.Subject, Message: Message{ItemID: 10, Key: key, Dispatch: 2}}}}
	got, err := DecodeBatch(b.Encode())
	if err != nil || len(got.Items) != 2 || got.Items[0] != good || got.Items[1].Dispatch != 2 {
		t.Fatalf("round trip: %+v, %v", got, err)
	}
	for _, bad := range []string{"", "{", `{"items":[]}`, `{}`, `[]`, `{"items":{}}`} {
		if _, err := DecodeBatch([]byte(bad)); !errors.Is(err, ErrBadMessage) {
			t.Errorf("DecodeBatch(%q): got %v, want ErrBadMessage", bad, err)
		}
	}
	cases := []struct {
		name string
		e    BatchEntry
		ok   bool
	}{
		{"good", good, true},
		{"no subject", BatchEntry{Message: good.Message}, false},
		{"another stream's subject", BatchEntry{Subject: "aurora.events.X", Message: good.Message}, false},
		{"no item id", BatchEntry{Subject: good.Subject, Message: Message{Key: key, Dispatch: 1}}, false},
		{"short key", BatchEntry{Subject: good.Subject, Message: Message{ItemID: 1, Key: "k", Dispatch: 1}}, false},
		{"dispatch 0", BatchEntry{Subject: good.Subject, Message: Message{ItemID: 1, Key: key}}, false},
	}
	for _, c := range cases {
		if err := c.e.Validate(); (err == nil) != c.ok || (err != nil && !errors.Is(err, ErrBadMessage)) {
			t.Errorf("%s: Validate() = %v", c.name, err)
		}
	}
}

func TestBatchMsgIDDependsOnItemsDispatchesAndOrder(t *testing.T) {
	t.Parallel()
	e := func(id int64, d int32) BatchEntry {
		return BatchEntry{Subject: "aurora.outbox.x.t.0", Message: Message{ItemID: id, Key: strings.Repeat(fmt.Sprint(id), 64), Dispatch: d}}
	}
	base := BatchMsgID(Batch{Items: []BatchEntry{e(1, 1), e(2, 1)}})
	if !strings.HasPrefix(base, "batch.") || len(base) != len("batch.")+64 {
		t.Fatalf("shape: %q", base)
	}
	if again := BatchMsgID(Batch{Items: []BatchEntry{e(1, 1), e(2, 1)}}); again != base {
		t.Error("the same batch must give the same id")
	}
	for name, other := range map[string]Batch{
		"order":    {Items: []BatchEntry{e(2, 1), e(1, 1)}},
		"dispatch": {Items: []BatchEntry{e(1, 1), e(2, 2)}},
		"fewer":    {Items: []BatchEntry{e(1, 1)}},
	} {
		if BatchMsgID(other) == base {
			t.Errorf("%s: a different batch got the same id", name)
		}
	}
}

func TestSubjectMatches(t *testing.T) {
	t.Parallel()
	cases := []struct {
		filter, subject string
		want            bool
	}{
		{"aurora.outbox.x.*.3", "aurora.outbox.x._batch.3", true},
		{"aurora.outbox.x.*.3", "aurora.outbox.x.org_1.3", true},
		{"aurora.outbox.x.*.3", "aurora.outbox.x._batch.4", false},
		{"aurora.outbox.x.org_1.3", "aurora.outbox.x._batch.3", false},
		{"aurora.outbox.>", "aurora.outbox.x._batch.3", true},
		{"aurora.outbox.>", "aurora.outbox", false},
		{"aurora.outbox.x.*", "aurora.outbox.x.t.3", false},
		{"aurora.outbox.x.*.3", "aurora.outbox.x.t", false},
		{"aurora.>.x", "aurora.a.x", false},
	}
	for _, c := range cases {
		if got := SubjectMatches(c.filter, c.subject); got != c.want {
			t.Errorf("SubjectMatches(%q, %q) = %v, want %v", c.filter, c.subject, got, c.want)
		}
	}
	if got := BatchSubject("stripe_meter_events", 7); got != "aurora.outbox.stripe_meter_events._batch.7" {
		t.Errorf("BatchSubject: %q", got)
	}
	if rawTenantToken.MatchString(BatchToken) || TenantToken(BatchToken) == BatchToken {
		t.Error("the batch token must not be a tenant token")
	}
}
