// Package sql holds the SQL files people run against their database
// (publication.sql, role.sql, outbox-membership.sql, ...). The streamer
// embeds the one it runs itself, so that what it installs is the file the
// documentation tells people to run, not a copy.
package sql

import _ "embed"

// Membership is outbox-membership.sql: the event trigger that adds a table
// matching a registered outbox pattern to its publication in the
// transaction that makes it match.
//
//go:embed outbox-membership.sql
var Membership string
