// Package jsapi tells a JetStream API error that refuses a request from
// one that says JetStream cannot answer yet.
//
// JetStream's status codes do not tell them apart (a configuration it will
// not apply is answered 500, 10052; no stream leader 503, 10008), so the
// error codes do: JetStream could not answer now — "JetStream system
// temporarily unavailable" (10008: no leader, no quorum, as while NATS
// nodes are down), "JetStream cluster can not handle request" (10009: a
// node that is not the leader), "incomplete results" (10004) — and passes
// once the cluster recovers; any other API error refuses the request as
// made, and making it again gives the same answer. A service that took an
// outage for a refusal stopped for good on it (the chaos harness's long
// run saw deliverers and relays exit on 10008).
package jsapi

import (
	"errors"

	"github.com/nats-io/nats.go/jetstream"
)

// unavailable are the error codes of JetStream not able to answer now
// (nats-server's errors.json: JSClusterNotAvailErr, JSClusterNotLeaderErr,
// JSClusterIncompleteErr).
var unavailable = map[jetstream.ErrorCode]bool{10008: true, 10009: true, 10004: true}

// Unavailable reports whether err is (or wraps) a JetStream API error
// saying JetStream cannot answer now (no leader, no quorum): worth
// retrying.
func Unavailable(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && unavailable[apiErr.ErrorCode]
}

// Refused reports whether err is (or wraps) any other JetStream API error:
// JetStream refused the request, and retrying it as it is will not help.
func Refused(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && !unavailable[apiErr.ErrorCode]
}
