import io.debezium.engine.DebeziumEngine;
import io.debezium.engine.RecordChangeEvent;
import io.debezium.engine.format.ChangeEventFormat;
import io.debezium.engine.format.Connect;
import java.io.BufferedReader;
import java.io.FileInputStream;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.OutputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.kafka.connect.json.JsonConverter;
import org.apache.kafka.connect.source.SourceRecord;

/**
 * The Debezium embedded engine capturing real PostgreSQL servers for the tests
 * (tests/helpers/debezium.py): one engine per {@code name=properties-file} argument, all in
 * this JVM. Every change event is written twice, by Kafka Connect's JsonConverter with
 * {@code schemas.enable} true (under {@code <out>/<name>/schemas}) and false ({@code
 * <out>/<name>/plain}), one record per line, in objects named as Confluent's S3 sink names
 * them: {@code topics/<topic>/partition=0/<topic>+0+<first offset>.json}, a new object every
 * {@code rotate} records of a topic. A line "slot <name>" on stdout says an engine's task
 * started (its slot exists); "stop" on stdin ends the capture once no engine has had a
 * record for {@code idle-ms}; each engine commits its offsets as it closes.
 *
 * <p>Usage: {@code DebeziumCapture <out> <rotate> <idle-ms> name=props [name=props ...]}
 */
public final class DebeziumCapture {
  private static final AtomicLong LAST = new AtomicLong(System.currentTimeMillis());

  /** One engine's output: its two converters and, per mode and topic, the open object. */
  static final class Sink {
    final Path root;
    final int rotate;
    final JsonConverter withSchema = converter(true);
    final JsonConverter plain = converter(false);
    final Map<String, Long> offsets = new HashMap<>();
    final Map<String, OutputStream> open = new HashMap<>();

    Sink(Path root, int rotate) {
      this.root = root;
      this.rotate = rotate;
    }

    static JsonConverter converter(boolean schemas) {
      JsonConverter c = new JsonConverter();
      Map<String, Object> conf = new HashMap<>();
      conf.put("schemas.enable", schemas);
      c.configure(conf, false);
      return c;
    }

    synchronized void write(SourceRecord r) throws IOException {
      if (r.value() == null) {
        return; // a Kafka tombstone after a delete: the S3 sink's "behavior.on.null.values"
      }
      String topic = r.topic();
      long offset = offsets.getOrDefault(topic, 0L);
      for (String mode : new String[] {"schemas", "plain"}) {
        JsonConverter c = mode.equals("schemas") ? withSchema : plain;
        String key = mode + "/" + topic;
        if (offset % rotate == 0) {
          OutputStream old = open.remove(key);
          if (old != null) {
            old.close();
          }
          Path dir = root.resolve(mode).resolve("topics").resolve(topic).resolve("partition=0");
          Files.createDirectories(dir);
          Path file = dir.resolve(topic + "+0+" + String.format("%010d", offset) + ".json");
          open.put(key, Files.newOutputStream(file));
        }
        OutputStream out = open.get(key);
        out.write(c.fromConnectData(topic, r.valueSchema(), r.value()));
        out.write('\n');
      }
      offsets.put(topic, offset + 1);
    }

    synchronized void close() throws IOException {
      for (OutputStream o : open.values()) {
        o.close();
      }
      open.clear();
    }
  }

  public static void main(String[] args) throws Exception {
    Path out = Paths.get(args[0]);
    int rotate = Integer.parseInt(args[1]);
    long idleMs = Long.parseLong(args[2]);
    List<DebeziumEngine<RecordChangeEvent<SourceRecord>>> engines = new ArrayList<>();
    List<Sink> sinks = new ArrayList<>();
    ExecutorService pool = Executors.newCachedThreadPool();
    for (int i = 3; i < args.length; i++) {
      String[] spec = args[i].split("=", 2);
      String name = spec[0];
      Properties props = new Properties();
      try (FileInputStream in = new FileInputStream(spec[1])) {
        props.load(in);
      }
      Sink sink = new Sink(out.resolve(name), rotate);
      sinks.add(sink);
      DebeziumEngine<RecordChangeEvent<SourceRecord>> engine =
          DebeziumEngine.create(ChangeEventFormat.of(Connect.class))
              .using(props)
              .using(
                  new DebeziumEngine.ConnectorCallback() {
                    @Override
                    public void taskStarted() {
                      System.out.println("slot " + name);
                      System.out.flush();
                    }
                  })
              .using(
                  (success, message, error) -> {
                    if (!success) {
                      System.out.println("failed " + name + ": " + message);
                      System.out.flush();
                    }
                  })
              .notifying(
                  event -> {
                    try {
                      sink.write(event.record());
                      LAST.set(System.currentTimeMillis());
                    } catch (IOException e) {
                      throw new RuntimeException(e);
                    }
                  })
              .build();
      engines.add(engine);
      pool.execute(engine);
    }
    BufferedReader stdin = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
    String line;
    while ((line = stdin.readLine()) != null && !line.trim().equals("stop")) {
      // the test says when its workload is done
    }
    while (System.currentTimeMillis() - LAST.get() < idleMs) {
      Thread.sleep(100);
    }
    for (DebeziumEngine<RecordChangeEvent<SourceRecord>> e : engines) {
      e.close();
    }
    pool.shutdown();
    pool.awaitTermination(60, TimeUnit.SECONDS);
    for (Sink s : sinks) {
      s.close();
    }
    System.out.println("done");
    System.out.flush();
  }
}
