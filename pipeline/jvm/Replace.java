/*
 * A table's (or one partition's) files replaced by new rows in one Delta commit, the files
 * to remove taken from the checksum file of the version the commit starts from
 * (pipeline/lake.py calls it; pipeline/jars.py builds it with the log store).
 *
 * Delta's own overwrite finds the files it removes by a scan of the table's state, which
 * it reconstructs with Spark jobs over the log: about four jobs and a second for any table,
 * however small, in every new process. The checksum file of a version lists the table's
 * files when the table holds few of them (Delta writes "allFiles" there); with that list the
 * commit needs only the write of the new files. When the checksum has no list, or the rows'
 * schema is not the table's, this returns -1 and the caller writes through Delta's own
 * overwrite. The commit goes through Delta's transaction (its conflict check, the log
 * store, checkpoints and checksums), as an overwrite would.
 */
package cdr.delta;

import java.util.ArrayList;
import java.util.List;
import java.util.Map;

import org.apache.hadoop.fs.Path;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.SaveMode;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.delta.DeltaLog;
import org.apache.spark.sql.delta.DeltaOperations;
import org.apache.spark.sql.delta.OptimisticTransaction;
import org.apache.spark.sql.delta.Snapshot;
import org.apache.spark.sql.delta.VersionChecksum;
import org.apache.spark.sql.delta.actions.Action;
import org.apache.spark.sql.delta.actions.AddFile;
import org.apache.spark.sql.delta.actions.FileAction;
import org.apache.spark.sql.types.StructType;
import scala.Option;
import scala.collection.immutable.Seq;
import scala.jdk.javaapi.CollectionConverters;

public final class Replace {
    private Replace() {}

    /**
     * Replace the files of table {@code path} whose partition column {@code column} holds
     * {@code value} (every file, if {@code column} is null) by {@code rows}, in one commit
     * carrying {@code userMetadata}. {@code options}: the writer's options (the lease's
     * Hadoop settings, fs.*) for the table's log store. Returns the version committed, or
     * -1 when the checksum of the version read lists no files or the schema differs.
     */
    public static long replace(
            SparkSession spark,
            String path,
            Dataset<Row> rows,
            Map<String, String> options,
            String column,
            String value,
            String predicate,
            String userMetadata) {
        scala.collection.immutable.Map<String, String> opts =
                scala.collection.immutable.Map$.MODULE$.from(CollectionConverters.asScala(options));
        DeltaLog log = DeltaLog.forTable(spark, new Path(path), opts);
        OptimisticTransaction txn = log.startTransaction();
        Snapshot snapshot = txn.snapshot();
        Option<VersionChecksum> crc = snapshot.checksumOpt();
        if (snapshot.version() < 0 || crc.isEmpty() || crc.get().allFiles().isEmpty()) {
            return -1;
        }
        StructType have = snapshot.metadata().schema().asNullable();
        if (!have.equals(rows.schema().asNullable())) {
            return -1;
        }
        List<Action> actions = new ArrayList<>();
        long now = System.currentTimeMillis();
        for (AddFile f : CollectionConverters.asJava(crc.get().allFiles().get())) {
            if (column == null || value.equals(f.partitionValues().getOrElse(column, () -> null))) {
                actions.add(f.removeWithTimestamp(now, true));
            }
        }
        for (FileAction a : CollectionConverters.asJava(txn.writeFiles(rows))) {
            actions.add(a);
        }
        Option<Seq<String>> partitionBy =
                column == null
                        ? Option.empty()
                        : Option.apply(CollectionConverters.asScala(List.of(column)).toSeq());
        DeltaOperations.Write op =
                new DeltaOperations.Write(
                        SaveMode.Overwrite,
                        partitionBy,
                        Option.apply(predicate),
                        Option.apply(userMetadata),
                        Option.empty(),
                        Option.empty(),
                        Option.empty(),
                        Option.empty(),
                        Option.empty());
        return txn.commit(CollectionConverters.asScala(actions).toSeq(), op);
    }
}
