module github.com/aurora-billing/aurora/inbox

go 1.26.8

require (
	github.com/aurora-billing/aurora/migrations v0.0.0
	github.com/aurora-billing/aurora/shared v0.0.0
)

replace (
	github.com/aurora-billing/aurora/migrations => ../migrations
	github.com/aurora-billing/aurora/shared => ../shared
)
