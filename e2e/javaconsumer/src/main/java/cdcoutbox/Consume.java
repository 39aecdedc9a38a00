package cdcoutbox;

import com.google.protobuf.DynamicMessage;
import com.google.protobuf.util.JsonFormat;
import io.apicurio.registry.serde.avro.AvroKafkaDeserializer;
import io.apicurio.registry.serde.config.SerdeConfig;
import io.apicurio.registry.serde.jsonschema.JsonSchemaDeserializer;
import io.apicurio.registry.serde.protobuf.ProtobufDeserializer;
import io.apicurio.registry.serde.protobuf.ProtobufKafkaDeserializer;
import java.time.Duration;
import java.time.Instant;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.Deserializer;

/**
 * Reads the first COUNT records of partition 0 of TOPIC with Apicurio
 * Registry's Kafka deserializer for FORMAT (avro, protobuf, json-schema),
 * configured to read the Confluent wire format (the schema's id in four
 * bytes after a zero byte, no Apicurio headers), and prints each value as
 * one line of JSON. Exits 1, saying how many it read, when COUNT records
 * have not come within the timeout.
 *
 * <pre>
 * Consume BROKERS REGISTRY_URL FORMAT TOPIC COUNT TIMEOUT_SECONDS [MESSAGE_TYPE]
 * </pre>
 *
 * REGISTRY_URL is the registry's own API (Apicurio 3: .../apis/registry/v3).
 * MESSAGE_TYPE (Protobuf) is the message's name within its .proto file:
 * Apicurio's Protobuf deserializer skips Confluent's message indexes
 * rather than reading the message from them, and takes the type from
 * Apicurio's own headers or from its caller.
 */
public final class Consume {
    public static void main(String[] args) throws Exception {
        if (args.length < 6) {
            System.err.println("usage: Consume BROKERS REGISTRY_URL FORMAT TOPIC COUNT TIMEOUT_SECONDS [MESSAGE_TYPE]");
            System.exit(2);
        }
        String brokers = args[0], registry = args[1], format = args[2], topic = args[3];
        int count = Integer.parseInt(args[4]);
        Instant deadline = Instant.now().plusSeconds(Long.parseLong(args[5]));
        String messageType = args.length > 6 ? args[6] : null;

        Map<String, Object> serde = new HashMap<>();
        serde.put("apicurio.registry.url", registry);
        // The Confluent wire format: the id in the value, none in headers;
        // four bytes (the default id handler of Apicurio 3), the id the
        // Confluent-compatible API hands out (the content id).
        serde.put("apicurio.registry.headers.enabled", false);
        serde.put("apicurio.registry.use-id", "contentId");

        Deserializer<?> values;
        switch (format) {
            case "avro" -> values = new AvroKafkaDeserializer<>();
            case "json-schema" -> values = new JsonSchemaValues();
            case "protobuf" -> {
                // Confluent's message indexes come before the message;
                // Apicurio's own type reference does not.
                serde.put("apicurio.registry.serde.read-indexes", true);
                serde.put("apicurio.registry.serde.read-type-ref", false);
                serde.put("apicurio.registry.deserializer.value.return-class", DynamicMessage.class.getName());
                values = new NamedProtobufDeserializer(messageType);
            }
            default -> throw new IllegalArgumentException("unknown format " + format);
        }
        values.configure(serde, false);

        Properties props = new Properties();
        props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, brokers);
        props.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, false);
        props.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        props.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
        int read = 0;
        try (KafkaConsumer<byte[], ?> consumer = new KafkaConsumer<>(props, new ByteArrayDeserializer(), values)) {
            TopicPartition p = new TopicPartition(topic, 0);
            consumer.assign(List.of(p));
            consumer.seekToBeginning(List.of(p));
            while (read < count) {
                Duration left = Duration.between(Instant.now(), deadline);
                if (left.isNegative()) {
                    System.err.printf("read %d of %d records of %s before the timeout%n", read, count, topic);
                    System.exit(1);
                }
                for (ConsumerRecord<byte[], ?> r : consumer.poll(left.compareTo(Duration.ofMillis(500)) < 0 ? left : Duration.ofMillis(500))) {
                    if (read++ < count) {
                        System.out.println(json(r.value()));
                    }
                }
            }
        }
        System.out.flush();
    }

    private static String json(Object value) throws Exception {
        if (value instanceof DynamicMessage m) {
            return JsonFormat.printer().omittingInsignificantWhitespace().print(m);
        }
        // An Avro GenericRecord prints itself as JSON, a JSON Schema
        // value is a Jackson JsonNode.
        return String.valueOf(value);
    }

    /**
     * Apicurio's JSON Schema deserializer as a Kafka deserializer: what its
     * Kafka wrapper does for a record without headers (see pom.xml for why
     * not the wrapper itself).
     */
    static final class JsonSchemaValues implements Deserializer<Object> {
        private final JsonSchemaDeserializer<Object> deserializer = new JsonSchemaDeserializer<>();

        @Override
        public void configure(Map<String, ?> configs, boolean isKey) {
            deserializer.configure(new SerdeConfig(configs), isKey);
        }

        @Override
        public Object deserialize(String topic, byte[] data) {
            return deserializer.deserializeData(topic, data);
        }
    }

    /** Apicurio's Kafka Protobuf deserializer, told the message type. */
    static final class NamedProtobufDeserializer extends ProtobufKafkaDeserializer<DynamicMessage> {
        private final String messageType;

        NamedProtobufDeserializer(String messageType) {
            this.messageType = messageType;
        }

        @Override
        public void configure(Map<String, ?> configs, boolean isKey) {
            super.configure(configs, isKey);
            if (messageType != null) {
                ((ProtobufDeserializer<?>) delegatedDeserializer).setMessageTypeName(messageType);
            }
        }
    }
}
