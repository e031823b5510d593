"""The vocabulary below both planes: PostgreSQL's clock, time rules and cron syntax, daylight-saving notes, the
choices a schedule is made of and its shard. Neither plane's code lives here, and this imports neither."""
