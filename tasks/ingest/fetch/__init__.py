"""Fetching a URL-list source (GPIC's Stage 1): licensed URLs fetched once, politely, with every
opt-out honoured and no private address reachable. One fetch unit per input partition writes the
partition's fetch ledger and puts the bytes in a content-addressed store; ingest then reads them
like any other source (docs/fetch.md)."""
