package deliverer

import (
	"fmt"
	"testing"

	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/nats-io/nats.go/jetstream"
)

type laneMsg struct {
	jetstream.Msg // nil: only Subject and Data are used by lanes
	subject       string
	data          []byte
}

func (m laneMsg) Subject() string { return m.subject }
func (m laneMsg) Data() []byte    { return m.data }

func msgFor(tenant, feature string, item int64) laneMsg {
	return laneMsg{subject: outbox.Subject(outbox.DefaultExporter, tenant),
		data: outbox.Message{ItemID: item, Key: "k", Dispatch: 1, Feature: feature}.Encode()}
}

func TestLanes(t *testing.T) {
	t.Parallel()
	l := newLanes()
	beats := 0
	beat := func(jetstream.Msg) func() { beats++; return func() { beats-- } }
	join := func(m laneMsg) laneMode {
		key, item := laneKey(m)
		return l.join(key, item, m, beat)
	}
	a1, a2, a3 := msgFor("org_a", "api_calls", 1), msgFor("org_a", "api_calls", 2), msgFor("org_a", "api_calls", 3)
	b1 := msgFor("org_a", "egress_bytes", 4)
	tests := []struct {
		name string
		msg  laneMsg
		want laneMode
	}{
		{"first message owns the lane", a1, laneOwner},
		{"same tenant and feature queues", a2, laneQueued},
		{"other feature of the tenant is another lane", b1, laneOwner},
		{"the running item again bypasses (a re-dispatch must not wait for itself)", msgFor("org_a", "api_calls", 1), laneBypass},
		{"a queued item again bypasses", msgFor("org_a", "api_calls", 2), laneBypass},
		{"another item queues", a3, laneQueued},
	}
	for _, tt := range tests {
		if got := join(tt.msg); got != tt.want {
			t.Fatalf("%s: got %v, want %v", tt.name, got, tt.want)
		}
	}
	if beats != 2 {
		t.Fatalf("queued messages heartbeating: %d, want 2", beats)
	}
	key, _ := laneKey(a1)
	g := l.nextGroup(key, 1)
	if len(g) != 1 || string(g[0].Data()) != string(a2.data) {
		t.Fatal("nextGroup is not FIFO or ignores its limit")
	}
	if beats != 1 {
		t.Fatalf("a grouped message still heartbeats from the queue: %d beating, want 1", beats)
	}
	if got := join(msgFor("org_a", "api_calls", 2)); got != laneBypass {
		t.Fatal("an item of the running group must bypass")
	}
	if got := join(msgFor("org_a", "api_calls", 1)); got != laneQueued {
		t.Fatal("an item of the finished group must queue again")
	}
	rest := l.drain(key)
	if len(rest) != 2 || beats != 0 {
		t.Fatalf("drain returned %d, %d still beating", len(rest), beats)
	}
	if l.nextGroup(key, 10) != nil {
		t.Fatal("drained lane still open")
	}
	if got := join(a1); got != laneOwner {
		t.Fatal("a closed lane must be reopened by the next message")
	}
}

// TestLaneGroups: what queued while a group ran is the next group, up to
// the limit, oldest first; an empty lane closes.
func TestLaneGroups(t *testing.T) {
	t.Parallel()
	l := newLanes()
	beat := func(jetstream.Msg) func() { return func() {} }
	first := msgFor("org_b", "api_calls", 10)
	key, _ := laneKey(first)
	if l.join(key, 10, first, beat) != laneOwner {
		t.Fatal("first message must own the lane")
	}
	for i := int64(11); i <= 15; i++ {
		if got := l.join(key, i, msgFor("org_b", "api_calls", i), beat); got != laneQueued {
			t.Fatalf("item %d: %v, want queued", i, got)
		}
	}
	var sizes []int
	var order []int64
	for g := l.nextGroup(key, 3); g != nil; g = l.nextGroup(key, 3) {
		sizes = append(sizes, len(g))
		for _, m := range g {
			_, item := laneKey(m)
			order = append(order, item)
		}
	}
	if fmt.Sprint(sizes) != "[3 2]" || fmt.Sprint(order) != "[11 12 13 14 15]" {
		t.Fatalf("groups %v, order %v; want [3 2] and 11..15", sizes, order)
	}
	if l.join(key, 16, msgFor("org_b", "api_calls", 16), beat) != laneOwner {
		t.Fatal("a closed lane must be reopened by the next message")
	}
}
