package natstest

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func TestRestartKeepsURLAndStream(t *testing.T) {
	t.Parallel()
	srv := New(t)
	url := srv.URL()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "t.1", []byte("x")); err != nil {
		t.Fatal(err)
	}
	srv.Restart()
	if srv.URL() != url {
		t.Fatalf("url changed: %s → %s", url, srv.URL())
	}
	for {
		info, err := js.Stream(ctx, "T")
		if err == nil {
			if n := info.CachedInfo().State.Msgs; n != 1 {
				t.Fatalf("stream holds %d messages after restart, want 1", n)
			}
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("stream not reachable after restart: %v", err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
