// Package sqlapi holds the tests and examples of aurora's SQL API
// (aurora.record_usage and aurora.record_usage_correction, the
// record_usage_sql_api migration) as applications in other languages call
// it: python/record_usage.py runs
// with psycopg, and the test checks that what it committed is delivered to
// the provider exactly once and what it rolled back never exists. The
// refusal-by-refusal comparison with the Go recorder is in shared/usage
// (TestSQLAPIRefusesAsTheGoRecorder).
package sqlapi
