// Package inbox is the Stripe webhook inbox of seed 003: an HTTP endpoint
// that verifies, stores durably and only then answers 200, and a worker that
// projects subscriptions, invoices and entitlements under strict ordering
// and ambiguity rules.
package inbox
