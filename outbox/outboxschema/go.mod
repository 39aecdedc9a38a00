module github.com/cdc-outbox/cdc-outbox/outbox/outboxschema

go 1.26.0

require (
	github.com/cdc-outbox/cdc-outbox/outbox v0.0.0-00010101000000-000000000000
	github.com/cdc-outbox/cdc-outbox/schema v0.0.0-00010101000000-000000000000
	github.com/jackc/pgx/v5 v5.12.0
)

require (
	github.com/bufbuild/protocompile v0.14.1 // indirect
	github.com/go-viper/mapstructure/v2 v2.4.0 // indirect
	github.com/hamba/avro/v2 v2.31.0 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	github.com/json-iterator/go v1.1.12 // indirect
	github.com/modern-go/concurrent v0.0.0-20180306012644-bacd9c7ef1dd // indirect
	github.com/modern-go/reflect2 v1.0.2 // indirect
	github.com/santhosh-tekuri/jsonschema/v6 v6.0.3 // indirect
	github.com/twmb/franz-go/pkg/sr v1.8.0 // indirect
	golang.org/x/sync v0.25.0 // indirect
	golang.org/x/text v0.42.0 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)

// Development builds against the outbox and schema packages of this
// repository; a service gets the versions required above.
replace (
	github.com/cdc-outbox/cdc-outbox/outbox => ../
	github.com/cdc-outbox/cdc-outbox/schema => ../../schema
)
