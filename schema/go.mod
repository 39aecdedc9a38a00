module github.com/cdc-outbox/cdc-outbox/schema

go 1.26.0

require (
	github.com/bufbuild/protocompile v0.14.1
	github.com/hamba/avro/v2 v2.31.0
	github.com/santhosh-tekuri/jsonschema/v6 v6.0.3
	github.com/twmb/franz-go/pkg/sr v1.8.0
	golang.org/x/text v0.42.0
	google.golang.org/protobuf v1.36.12
)

require (
	github.com/go-viper/mapstructure/v2 v2.4.0 // indirect
	github.com/json-iterator/go v1.1.12 // indirect
	github.com/modern-go/concurrent v0.0.0-20180306012644-bacd9c7ef1dd // indirect
	github.com/modern-go/reflect2 v1.0.2 // indirect
	golang.org/x/sync v0.25.0 // indirect
)
