/*
 * Hadoop's local file system, without a process started per permission (pipeline/spark.py
 * sets it as spark.hadoop.fs.file.impl; pipeline/jars.py builds it with the log store).
 *
 * Without Hadoop's native library (pyspark ships none), RawLocalFileSystem sets a
 * permission by running chmod in a child process of the JVM: one for every file and
 * folder a write, a Delta commit or a job's output committer creates. Four small scenario
 * runs of the test suite started 652 of them (a Java Flight Recording of their JVM), each
 * a fork of a JVM of several GB. Here the JDK sets the same bits in the calling thread. A
 * permission with the sticky bit, or a file system without POSIX permissions, is left to
 * Hadoop's own way.
 */
package cdr.fs;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.attribute.PosixFilePermissions;

import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsPermission;

public class LocalFileSystem extends org.apache.hadoop.fs.LocalFileSystem {

    public LocalFileSystem() {
        super(new Raw());
    }

    /** The raw local file system, its permissions set by the JDK. */
    public static class Raw extends RawLocalFileSystem {
        @Override
        public void setPermission(Path p, FsPermission permission) throws IOException {
            try {
                // "rwxr-x---": the nine symbols chmod would set; a sticky bit ("t"), which
                // the JDK cannot set, is refused and goes to Hadoop's own way
                Files.setPosixFilePermissions(pathToFile(p).toPath(),
                        PosixFilePermissions.fromString(permission.toString()));
            } catch (UnsupportedOperationException | IllegalArgumentException e) {
                super.setPermission(p, permission);
            }
        }
    }
}
