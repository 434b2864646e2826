package gauge

import "errors"

// ErrQuery: a figure could not be measured (the database is unreachable, a
// statement failed or ran past Config.QueryTimeoutMS). Read wraps the cause,
// naming the figure; the exporter logs the cause and fails the scrape.
var ErrQuery = errors.New("gauge: query failed")
