/*
 * Spark's commit protocol for the run's Parquet writes into the work location, with the
 * committer Hadoop chooses for the path's file system (pipeline/spark.py sets it as
 * spark.sql.sources.commitProtocolClass; pipeline/jars.py builds it with the log store).
 *
 * Spark's own protocol takes the committer of the output format, the file committer,
 * whose job commit renames every task's files into place from the driver. On S3 a
 * rename is a copy and a delete, one file after another, signed by the driver's
 * credentials. Hadoop's committer factory gives s3a paths the S3A committer that
 * spark.hadoop.fs.s3a.committer.name names (the magic one here): each task uploads its
 * files as multipart uploads it does not complete, and the job commit completes them
 * (no byte copied, none through the driver). A local path gets the file committer, as
 * before. Dynamic partition overwrite is not supported: the pipeline's writes are
 * static.
 */
package cdr.spark;

import java.io.IOException;
import java.io.UncheckedIOException;

import org.apache.hadoop.fs.Path;
import org.apache.hadoop.mapreduce.OutputCommitter;
import org.apache.hadoop.mapreduce.TaskAttemptContext;
import org.apache.hadoop.mapreduce.lib.output.PathOutputCommitter;
import org.apache.hadoop.mapreduce.lib.output.PathOutputCommitterFactory;
import org.apache.spark.internal.io.FileNameSpec;
import org.apache.spark.sql.execution.datasources.SQLHadoopMapReduceCommitProtocol;
import scala.Option;

public class PathCommitProtocol extends SQLHadoopMapReduceCommitProtocol {
    private static final long serialVersionUID = 1L;

    private final String destination;
    /** the committer of this JVM's job or task (set up on each side) */
    private transient PathOutputCommitter committer;

    public PathCommitProtocol(String jobId, String path, boolean dynamicPartitionOverwrite) {
        super(jobId, path, dynamicPartitionOverwrite);
        if (dynamicPartitionOverwrite) {
            throw new IllegalArgumentException(
                    "cdr.spark.PathCommitProtocol: dynamic partition overwrite is not supported");
        }
        this.destination = path;
    }

    @Override
    public OutputCommitter setupCommitter(TaskAttemptContext context) {
        try {
            committer = PathOutputCommitterFactory.createCommitter(new Path(destination), context);
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
        return committer;
    }

    /** A task's file goes where its committer works (for s3a's magic committer, a path
     * that the file system turns into an upload to the destination), not beside it. */
    @Override
    public String newTaskTempFile(TaskAttemptContext context, Option<String> dir, FileNameSpec spec) {
        Path work;
        try {
            work = committer.getWorkPath();
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
        Path parent = dir.isDefined() ? new Path(work, dir.get()) : work;
        return new Path(parent, getFilename(context, spec)).toString();
    }
}
