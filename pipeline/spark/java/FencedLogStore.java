/*
 * The Delta log store of every table cdr writes (pipeline/jars.py builds it; the session
 * names it for the file: and s3a: schemes). Two guarantees Delta's conflict check rests on,
 * across processes and machines, not only within one JVM:
 *
 *  1. A commit file is created only if absent: on s3a a conditional PUT (If-None-Match),
 *     on local files a hard link (link(2) fails if the name exists). A writer that loses
 *     the race gets java.nio.file.FileAlreadyExistsException, which Delta turns into its
 *     conflict check and retry.
 *  2. A commit is written only while the writer's run holds the store's lease with the
 *     epoch it acquired: the lease object is read just before the commit file is put. The
 *     run and its lease are named by the Hadoop settings cdr.lease.path, cdr.lease.run_id
 *     and cdr.lease.epoch (the table's write options, prefixed fs.); a write without them
 *     (a reader's maintenance, a test) is not fenced.
 *
 * Other files of the log (checkpoints, checksums, _last_checkpoint) are written as Delta's
 * own stores write them: they are derived from the commits and safe to write again.
 */
package cdr.delta;

import java.io.ByteArrayOutputStream;
import java.io.FileNotFoundException;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.FileAlreadyExistsException;
import java.nio.file.Files;
import java.util.Iterator;
import java.util.Map;
import java.util.UUID;
import java.util.regex.Pattern;

import com.fasterxml.jackson.databind.ObjectMapper;
import io.delta.storage.HDFSLogStore;
import io.delta.storage.HadoopFileSystemLogStore;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FSDataOutputStreamBuilder;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;

public class FencedLogStore extends HadoopFileSystemLogStore {
    /** The Hadoop settings that name the lease a commit needs (set as fs.cdr.lease.*). */
    public static final String LEASE_PATH = "fs.cdr.lease.path";
    public static final String LEASE_RUN = "fs.cdr.lease.run_id";
    public static final String LEASE_EPOCH = "fs.cdr.lease.epoch";
    /** What a refused commit's message starts with (pipeline.lake finds it there). */
    public static final String NOT_HELD = "cdr: the lease is not held";

    private static final Pattern COMMIT = Pattern.compile("\\d{20}\\.json");
    private static final String IF_ABSENT = "fs.option.create.conditional.overwrite";
    private static final String FAST_CREATE = "fs.s3a.create.performance";
    private static final ObjectMapper JSON = new ObjectMapper();

    private final HDFSLogStore other;

    public FencedLogStore(Configuration hadoopConf) {
        super(hadoopConf);
        this.other = new HDFSLogStore(hadoopConf);
    }

    @Override
    public void write(Path path, Iterator<String> actions, Boolean overwrite, Configuration conf)
            throws IOException {
        if (!overwrite && COMMIT.matcher(path.getName()).matches()) {
            checkLease(path, conf);
        }
        String scheme = path.toUri().getScheme();
        if ("s3a".equals(scheme)) {
            putS3(path, lines(actions), overwrite, conf);
        } else if ("file".equals(scheme) && !overwrite) {
            linkLocal(path, lines(actions));
        } else {
            other.write(path, actions, overwrite, conf);
        }
    }

    @Override
    public Boolean isPartialWriteVisible(Path path, Configuration conf) throws IOException {
        // an S3 object and a linked file appear whole; other schemes as HDFS's store says
        String scheme = path.toUri().getScheme();
        return !("s3a".equals(scheme) || "file".equals(scheme))
            && other.isPartialWriteVisible(path, conf);
    }

    private static byte[] lines(Iterator<String> actions) {
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        while (actions.hasNext()) {
            out.writeBytes((actions.next() + "\n").getBytes(StandardCharsets.UTF_8));
        }
        return out.toByteArray();
    }

    /** Refuse the commit unless the lease names this run and epoch. */
    static void checkLease(Path commit, Configuration conf) throws IOException {
        String where = conf.get(LEASE_PATH);
        String run = conf.get(LEASE_RUN);
        String epoch = conf.get(LEASE_EPOCH);
        if (where == null || run == null || epoch == null) {
            return;
        }
        Path lease = new Path(where);
        Map<?, ?> held;
        try (InputStream in = lease.getFileSystem(conf).open(lease)) {
            held = JSON.readValue(in.readAllBytes(), Map.class);
        } catch (FileNotFoundException e) {
            held = null;
        }
        if (held == null || !run.equals(held.get("run_id")) || !epoch.equals(held.get("epoch"))) {
            String who = held == null ? "nobody" : "run " + held.get("run_id") + " (epoch "
                + held.get("epoch") + ")";
            throw new IOException(NOT_HELD + " by run " + run + " (epoch " + epoch + ") but by "
                + who + "; not committed: " + commit);
        }
    }

    /** One PUT; a commit only if the key is absent (If-None-Match: *). */
    private static void putS3(Path path, byte[] body, boolean overwrite, Configuration conf)
            throws IOException {
        FileSystem fs = path.getFileSystem(conf);
        FSDataOutputStreamBuilder<?, ?> builder = fs.createFile(path).overwrite(overwrite);
        if (!overwrite) {
            // the condition makes S3 refuse a key that exists: no HEAD before it
            builder.must(IF_ABSENT, true).opt(FAST_CREATE, true);
        }
        try (FSDataOutputStream out = builder.build()) {
            out.write(body);
        } catch (org.apache.hadoop.fs.FileAlreadyExistsException e) {
            throw new FileAlreadyExistsException(path.toString());
        } catch (IOException e) {
            if (!overwrite && refusedAsPresent(e)) {
                throw new FileAlreadyExistsException(path.toString());
            }
            throw e;
        }
    }

    private static boolean refusedAsPresent(Throwable e) {
        for (Throwable t = e; t != null; t = t.getCause()) {
            String m = String.valueOf(t.getMessage());
            if (m.contains("412") || m.contains("PreconditionFailed")) {
                return true;
            }
        }
        return false;
    }

    /** A new local file, whole, under a name nobody else can have taken: link(2). */
    private static void linkLocal(Path path, byte[] body) throws IOException {
        java.nio.file.Path target = java.nio.file.Paths.get(path.toUri());
        java.nio.file.Path dir = target.getParent();
        if (!Files.isDirectory(dir)) {
            throw new FileNotFoundException("No such file or directory: " + dir);
        }
        String name = "." + target.getFileName() + "." + UUID.randomUUID() + ".tmp";
        java.nio.file.Path temp = dir.resolve(name);
        try {
            try (OutputStream out = Files.newOutputStream(temp)) {
                out.write(body);
            }
            Files.createLink(target, temp); // fails if the name exists, atomically
        } finally {
            Files.deleteIfExists(temp);
        }
    }
}
