import io.debezium.engine.DebeziumEngine;
import io.debezium.engine.RecordChangeEvent;
import io.debezium.engine.format.ChangeEventFormat;
import io.debezium.embedded.Connect;
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
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.kafka.connect.data.Struct;
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
 * started (its slot exists), "snapshot <name>" that its snapshot's last read was written;
 * "stop <token>" on stdin ends the capture once every engine has streamed the marker row
 * {@code <token>} the test inserted into {@code cdr_capture_marker} after its workload (so
 * every change committed before it); each engine commits its offsets as it closes.
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

  /** The marker tokens each engine has streamed (see {@link #marker}). */
  private static final Map<String, Set<String>> MARKS = new ConcurrentHashMap<>();

  /**
   * The token of a marker row the test inserted into {@code cdr_capture_marker} after its
   * workload (null for any other record): once an engine streamed it, it streamed every
   * change committed before it.
   */
  static String marker(SourceRecord r) {
    if (!r.topic().endsWith(".cdr_capture_marker")
        || !(r.value() instanceof Struct value)
        || value.schema().field("after") == null
        || value.getStruct("after") == null) {
      return null;
    }
    Object token = value.getStruct("after").get("token");
    return token == null ? null : token.toString();
  }

  /** Whether the record is the last read of the connector's snapshot. */
  static boolean lastOfSnapshot(SourceRecord r) {
    if (!(r.value() instanceof Struct value) || value.schema().field("source") == null) {
      return false;
    }
    Struct source = value.getStruct("source");
    return source != null
        && source.schema().field("snapshot") != null
        && "last".equals(source.get("snapshot"));
  }

  static boolean allMarked(List<String> names, String token) {
    for (String n : names) {
      if (!MARKS.getOrDefault(n, Set.of()).contains(token)) {
        return false;
      }
    }
    return true;
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
                    if (lastOfSnapshot(event.record())) {
                      System.out.println("snapshot " + name);
                      System.out.flush();
                    }
                    String mark = marker(event.record());
                    if (mark != null) {
                      MARKS.computeIfAbsent(name, k -> ConcurrentHashMap.newKeySet()).add(mark);
                    }
                  })
              .build();
      engines.add(engine);
      pool.execute(engine);
    }
    BufferedReader stdin = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
    String line;
    String token = null;
    while ((line = stdin.readLine()) != null) {
      // the test says when its workload is done: "stop <the marker's token>"
      if (line.startsWith("stop ")) {
        token = line.substring(5).trim();
        break;
      }
    }
    long stopped = System.currentTimeMillis();
    List<String> names = new ArrayList<>();
    for (int i = 3; i < args.length; i++) {
      names.add(args[i].split("=", 2)[0]);
    }
    while (token != null && !allMarked(names, token)) {
      if (System.currentTimeMillis() - stopped > idleMs * 40) {
        System.out.println("failed: no marker " + token + " from every engine: " + MARKS);
        System.out.flush();
        break;
      }
      Thread.sleep(50);
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
