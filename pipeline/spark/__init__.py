"""The Spark session, its JVM, its packages, and the types of the frames the stages pass."""
