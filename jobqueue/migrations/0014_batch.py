from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('jobqueue', '0013_global_cap_permission'),
    ]

    operations = [
        migrations.AddField(
            model_name='job',
            name='batch',
            field=models.CharField(blank=True, max_length=32, null=True),
        ),
    ]
