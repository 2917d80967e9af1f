"""A bot as one AWS Lambda function (``lambda_function.py``), runnable on this machine with
``python -m examples.aws_lambda`` (``local.py``)."""
