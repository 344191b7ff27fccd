/*
 * A table's (or one partition's) files replaced in one Delta commit, the files to remove
 * taken from the checksum file of the version the commit starts from (pipeline/lake.py
 * calls it; pipeline/jars.py builds it with the log store). The new files are either
 * written from rows ({@link #replace}) or Parquet files a run's tasks wrote already,
 * copied into the table by the executors and added as they are ({@link #adopt}).
 *
 * Delta's own overwrite finds the files it removes by a scan of the table's state, which
 * it reconstructs with Spark jobs over the log: about four jobs and a second for any table,
 * however small, in every new process. The checksum file of a version lists the table's
 * files when the table holds few of them (Delta writes "allFiles" there); with that list the
 * commit needs only the new files. When the checksum has no list, or the rows' schema is not
 * the table's, this returns -1 and the caller writes through Delta's own overwrite. The
 * commit goes through Delta's transaction (its conflict check, the log store, checkpoints
 * and checksums), as an overwrite would.
 */
package cdr.delta;

import java.time.LocalDate;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.UUID;

import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.FileUtil;
import org.apache.hadoop.fs.Path;
import org.apache.parquet.column.statistics.Statistics;
import org.apache.parquet.hadoop.ParquetFileReader;
import org.apache.parquet.hadoop.metadata.BlockMetaData;
import org.apache.parquet.hadoop.metadata.ColumnChunkMetaData;
import org.apache.parquet.hadoop.metadata.ParquetMetadata;
import org.apache.parquet.hadoop.util.HadoopInputFile;
import org.apache.parquet.io.api.Binary;
import org.apache.parquet.schema.LogicalTypeAnnotation;
import org.apache.parquet.schema.MessageType;
import org.apache.parquet.schema.PrimitiveType;
import org.apache.spark.api.java.JavaSparkContext;
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
import org.apache.spark.sql.delta.actions.Format;
import org.apache.spark.sql.delta.actions.Metadata;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.util.SerializableConfiguration;
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
        OptimisticTransaction txn = transaction(spark, path, options);
        List<Action> actions = removals(txn, rows.schema(), column, value);
        if (actions == null) {
            return -1;
        }
        for (FileAction a : CollectionConverters.asJava(txn.writeFiles(rows))) {
            actions.add(a);
        }
        return commit(txn, actions, SaveMode.Overwrite, column, predicate, userMetadata);
    }

    /**
     * Add the Parquet files {@code sources} (URIs) to table {@code path}, copied into its
     * folder (the partition's, if {@code column} is set) by the executors, as rows of {@code
     * schemaJson} (the table's schema, partition column included), each with the
     * statistics its footer gives ({@link #statistics}). With {@code overwrite}, the files
     * of the partition (or of the table) are removed in the same commit: those the
     * checksum lists, else those Delta's scan of the table's state finds. A table that does not exist yet is created
     * by that commit, with the properties {@code configuration}. Returns the version
     * committed, or -1 (nothing done) when the schema is not the table's.
     */
    public static long adopt(
            SparkSession spark,
            String path,
            List<String> sources,
            String schemaJson,
            Map<String, String> options,
            Map<String, String> configuration,
            boolean overwrite,
            String column,
            String value,
            String predicate,
            String userMetadata) {
        StructType schema = (StructType) DataType.fromJson(schemaJson);
        OptimisticTransaction txn = transaction(spark, path, options);
        List<Action> actions = new ArrayList<>();
        if (txn.snapshot().version() < 0) {
            List<String> partitionBy = column == null ? List.of() : List.of(column);
            Metadata metadata =
                    new Metadata(
                            UUID.randomUUID().toString(),
                            null,
                            null,
                            new Format("parquet", scala.collection.immutable.Map$.MODULE$.empty()),
                            schema.json(),
                            CollectionConverters.asScala(partitionBy).toSeq(),
                            scalaMap(configuration),
                            Option.apply(System.currentTimeMillis()));
            txn.updateMetadataForNewTable(metadata);
        } else if (overwrite) {
            actions = removals(txn, schema, column, value);
            if (actions == null && sameSchema(txn, schema)) {  // no list: Delta's own scan
                actions = remove(txn.filterFiles(), column, value);
            }
            if (actions == null) {
                return -1;
            }
        } else if (!sameSchema(txn, schema)) {
            return -1;
        }
        String folder = column == null ? "" : column + "=" + value + "/";
        List<String[]> copies = new ArrayList<>();
        for (String source : sources) {
            String name = folder + "cdr-" + UUID.randomUUID() + ".parquet";
            copies.add(new String[] {source, new Path(new Path(path), name).toString(), name});
        }
        Configuration conf = spark.sessionState().newHadoopConfWithOptions(scalaMap(options));
        SerializableConfiguration shared = new SerializableConfiguration(conf);
        List<String> columns = new ArrayList<>(List.of(schema.fieldNames()));
        List<String[]> written =
                copies.isEmpty()  // a table created empty: no job
                        ? List.of()
                        : JavaSparkContext.fromSparkContext(spark.sparkContext())
                                .parallelize(copies, copies.size())
                                .map(c -> copy(shared.value(), c[0], c[1], columns))
                                .collect();
        scala.collection.immutable.Map<String, String> partition =
                column == null
                        ? scala.collection.immutable.Map$.MODULE$.empty()
                        : scalaMap(Map.of(column, value));
        for (int i = 0; i < copies.size(); i++) {
            String[] landed = written.get(i);
            actions.add(
                    new AddFile(
                            copies.get(i)[2],
                            partition,
                            Long.parseLong(landed[0]),
                            Long.parseLong(landed[1]),
                            true,
                            landed[2],
                            null,
                            null,
                            Option.empty(),
                            Option.empty(),
                            Option.empty(),
                            Option.empty(),
                            Option.empty()));
        }
        SaveMode mode = overwrite ? SaveMode.Overwrite : SaveMode.Append;
        return commit(txn, actions, mode, column, overwrite ? predicate : null, userMetadata);
    }

    /**
     * One file copied (on an executor): its size and modification time where it landed,
     * and its Delta statistics ({@link #statistics}).
     */
    private static String[] copy(Configuration conf, String from, String to, List<String> columns)
            throws Exception {
        Path source = new Path(from);
        Path target = new Path(to);
        FileSystem into = target.getFileSystem(conf);
        FileUtil.copy(source.getFileSystem(conf), source, into, target, false, true, conf);
        FileStatus landed = into.getFileStatus(target);
        String stats;
        try (ParquetFileReader file =
                ParquetFileReader.open(HadoopInputFile.fromStatus(landed, conf))) {
            stats = statistics(file.getFooter(), columns);
        }
        return new String[] {
            Long.toString(landed.getLen()), Long.toString(landed.getModificationTime()), stats
        };
    }

    /**
     * A file's Delta statistics from its Parquet footer: its rows, and for each of the
     * table's first {@link #INDEXED} {@code columns} of a top-level primitive type, the
     * nulls, and the least and greatest values of the integers, dates and strings (of at
     * most {@link #SHORT} characters: Delta's own truncated bounds are not reproduced, so a
     * longer one leaves the file's bounds out, and a reader only skips it less often).
     */
    static String statistics(ParquetMetadata footer, List<String> columns) {
        ObjectMapper json = new ObjectMapper();
        ObjectNode stats = json.createObjectNode();
        long rows = 0;
        for (BlockMetaData block : footer.getBlocks()) {
            rows += block.getRowCount();
        }
        stats.put("numRecords", rows);
        ObjectNode least = stats.putObject("minValues");
        ObjectNode most = stats.putObject("maxValues");
        ObjectNode nulls = stats.putObject("nullCount");
        MessageType schema = footer.getFileMetaData().getSchema();
        for (String name : columns.subList(0, Math.min(INDEXED, columns.size()))) {
            if (!schema.containsField(name) || !schema.getType(name).isPrimitive()) {
                continue;
            }
            PrimitiveType type = schema.getType(name).asPrimitiveType();
            Statistics<?> merged = null;
            long nullCount = 0;
            boolean complete = true;
            for (BlockMetaData block : footer.getBlocks()) {
                Statistics<?> part = null;
                for (ColumnChunkMetaData chunk : block.getColumns()) {
                    if (chunk.getPath().size() == 1 && chunk.getPath().toArray()[0].equals(name)) {
                        part = chunk.getStatistics();
                    }
                }
                if (part == null || !part.isNumNullsSet()) {
                    complete = false;
                    break;
                }
                nullCount += part.getNumNulls();
                if (merged == null) {
                    merged = part.copy();
                } else {
                    merged.mergeStatistics(part);
                }
            }
            if (!complete || merged == null) {
                continue;
            }
            nulls.put(name, nullCount);
            if (merged.hasNonNullValue()) {
                bound(least, name, type, merged.genericGetMin());
                bound(most, name, type, merged.genericGetMax());
                if (least.has(name) != most.has(name)) {
                    least.remove(name);
                    most.remove(name);
                }
            }
        }
        stats.put("tightBounds", true);
        return stats.toString();
    }

    /** Delta's statistics: the first 32 columns of a table (its default). */
    private static final int INDEXED = 32;

    /** The longest string kept as a bound (Delta's default prefix length). */
    private static final int SHORT = 32;

    private static void bound(ObjectNode into, String name, PrimitiveType type, Object value) {
        LogicalTypeAnnotation logical = type.getLogicalTypeAnnotation();
        switch (type.getPrimitiveTypeName()) {
            case INT32:
                if (logical instanceof LogicalTypeAnnotation.DateLogicalTypeAnnotation) {
                    into.put(name, LocalDate.ofEpochDay((Integer) value).toString());
                } else if (logical == null || signed(logical)) {
                    into.put(name, (Integer) value);
                }
                break;
            case INT64:
                if (logical == null || signed(logical)) {
                    into.put(name, (Long) value);
                }
                break;
            case BINARY:
                if (logical instanceof LogicalTypeAnnotation.StringLogicalTypeAnnotation) {
                    String text = ((Binary) value).toStringUsingUTF8();
                    if (text.length() <= SHORT) {
                        into.put(name, text);
                    }
                }
                break;
            default:
                break;
        }
    }

    private static boolean signed(LogicalTypeAnnotation logical) {
        return logical instanceof LogicalTypeAnnotation.IntLogicalTypeAnnotation
                && ((LogicalTypeAnnotation.IntLogicalTypeAnnotation) logical).isSigned();
    }

    private static OptimisticTransaction transaction(
            SparkSession spark, String path, Map<String, String> options) {
        return DeltaLog.forTable(spark, new Path(path), scalaMap(options)).startTransaction();
    }

    /**
     * The remove actions of the files of the partition ({@code column} = {@code value}, or
     * every file), from the checksum of the version the transaction read; null when it
     * lists none or the table's schema is not {@code schema}.
     */
    private static List<Action> removals(
            OptimisticTransaction txn, StructType schema, String column, String value) {
        Snapshot snapshot = txn.snapshot();
        Option<VersionChecksum> crc = snapshot.checksumOpt();
        if (snapshot.version() < 0 || crc.isEmpty() || crc.get().allFiles().isEmpty()) {
            return null;
        }
        if (!sameSchema(txn, schema)) {
            return null;
        }
        return remove(crc.get().allFiles().get(), column, value);
    }

    /** The remove actions of those of {@code files} in the partition (or of every one). */
    private static List<Action> remove(Seq<AddFile> files, String column, String value) {
        List<Action> actions = new ArrayList<>();
        long now = System.currentTimeMillis();
        for (AddFile f : CollectionConverters.asJava(files)) {
            if (column == null || value.equals(f.partitionValues().getOrElse(column, () -> null))) {
                actions.add(f.removeWithTimestamp(now, true));
            }
        }
        return actions;
    }

    private static boolean sameSchema(OptimisticTransaction txn, StructType schema) {
        return txn.snapshot().metadata().schema().asNullable().equals(schema.asNullable());
    }

    private static long commit(
            OptimisticTransaction txn,
            List<Action> actions,
            SaveMode mode,
            String column,
            String predicate,
            String userMetadata) {
        Option<Seq<String>> partitionBy =
                column == null
                        ? Option.empty()
                        : Option.apply(CollectionConverters.asScala(List.of(column)).toSeq());
        DeltaOperations.Write op =
                new DeltaOperations.Write(
                        mode,
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

    private static scala.collection.immutable.Map<String, String> scalaMap(Map<String, String> m) {
        return scala.collection.immutable.Map$.MODULE$.from(CollectionConverters.asScala(m));
    }
}
