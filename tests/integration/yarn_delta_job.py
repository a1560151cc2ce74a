"""A Spark app for tests/integration/test_yarn.py: writes a Delta table to the URI it is given (an ``hdfs://`` one
there), changes it with an UPDATE, reads it back and prints one line the test checks. Submitted with spark-submit
--master yarn, so its executors write to HDFS from YARN containers."""
import sys

from pyspark.sql import SparkSession

uri = sys.argv[1]
spark = (SparkSession.builder.appName("eventlake-delta-on-hdfs")
         .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
         .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
         .getOrCreate())
(spark.range(0, 1000, numPartitions=4).selectExpr("id", "id % 7 AS bucket", "id * 3 AS amount_minor")
 .write.format("delta").mode("overwrite").save(uri))
spark.sql(f"UPDATE delta.`{uri}` SET amount_minor = amount_minor + 1 WHERE bucket = 0")  # version 1
back = spark.read.format("delta").load(uri)
version = spark.sql(f"DESCRIBE HISTORY delta.`{uri}`").agg({"version": "max"}).first()[0]
print(f"delta-on-hdfs: rows={back.count()} sum={back.groupBy().sum('amount_minor').first()[0]} version={version} "
      f"master={spark.sparkContext.master}", flush=True)
spark.stop()
