from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('jobqueue', '0016_console_charts_schedules_enqueue'),
    ]

    operations = [
        migrations.AddField(
            model_name='job',
            name='batch',
            field=models.CharField(blank=True, max_length=32, null=True),
        ),
    ]
