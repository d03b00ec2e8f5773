"""The typed values that cross from Airflow to the Spark jobs (standard library only; they ship in
the jobs' bundle, ``spark/launch.py``): a job's result and error."""
