package query

// The balances query's SQL and range, for the benchmark's EXPLAIN.
var (
	CurrentSumsSQL   = currentSums
	SumsAsOfSQL      = sumsAsOf
	SumsEffectiveSQL = sumsEffective
	PrefixEnd        = prefixEnd
)
