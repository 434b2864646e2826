package jsapi

import (
	"errors"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
)

func TestRefusedAndUnavailable(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name                 string
		err                  error
		refused, unavailable bool
	}{
		{"no error", nil, false, false},
		{"not an API error", errors.New("nats: timeout"), false, false},
		{"503 no leader", &jetstream.APIError{Code: 503, ErrorCode: 10008, Description: "JetStream system temporarily unavailable"}, false, true},
		{"500 not the leader", &jetstream.APIError{Code: 500, ErrorCode: 10009, Description: "JetStream cluster can not handle request"}, false, true},
		{"500 config refused", &jetstream.APIError{Code: 500, ErrorCode: 10052, Description: "stream configuration update can not change storage type"}, true, false},
		{"503 insufficient resources", &jetstream.APIError{Code: 503, ErrorCode: 10023, Description: "insufficient resources"}, true, false},
		{"404 stream not found", jetstream.ErrStreamNotFound, true, false},
		{"wrapped 503", fmt.Errorf("ensure: %w", &jetstream.APIError{Code: 503, ErrorCode: 10008}), false, true},
		{"wrapped 400", fmt.Errorf("ensure: %w", &jetstream.APIError{Code: 400, ErrorCode: 10025}), true, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			if got := Refused(c.err); got != c.refused {
				t.Errorf("Refused = %v, want %v", got, c.refused)
			}
			if got := Unavailable(c.err); got != c.unavailable {
				t.Errorf("Unavailable = %v, want %v", got, c.unavailable)
			}
		})
	}
}
