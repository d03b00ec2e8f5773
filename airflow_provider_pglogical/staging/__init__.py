"""The staging contract and the batch files between capture and the Spark apply."""
